"""Run as a script, a child finds its own package and nothing else of the engine's environment.

The child scripts run as files under the workload's interpreter, with their folder first on sys.path. Importing
this module takes that folder off sys.path (nothing here may shadow the workload's own modules) and registers
`mcp_server` and `mcp_server.children` from the files beside it, so `from mcp_server.children.common import ...`
works whether or not the workload's environment has Operator Profiler installed, without exposing the rest of
the engine's site-packages. The unusual name keeps it from shadowing a workload module in turn.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _register(name: str, folder: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register("mcp_server", os.path.dirname(_HERE))
_register("mcp_server.children", _HERE)
