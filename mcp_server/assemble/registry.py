"""The profiler backends, in the order `--backend auto` prefers them: the one place a backend is plugged in.

A new backend is one adapter (an object with the `mcp_server.backend.Backend` protocol, beside its assembler in
this package) and one entry here; `auto`, preflight, assemble and the faces read this mapping.
"""

from __future__ import annotations

from mcp_server.assemble.nsys import NSYS
from mcp_server.assemble.torch_profiler import TORCH_PROFILER
from mcp_server.backend import Backend
from mcp_server.errors import BackendUnavailable, ProfileFormatError
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.types import BACKENDS

AUTO = "auto"  # the choice that takes the first backend this machine has everything for

REGISTRY: dict[str, Backend] = {backend.name: backend for backend in (NSYS, TORCH_PROFILER)}


def choose_backend(requested: str) -> Backend:
    """The backend a capture runs: for `auto` the first one whose needs this machine meets; a named one when it
    does (BackendUnavailable, naming what is missing, when not)."""
    if requested == AUTO:
        for backend in REGISTRY.values():
            if not backend.missing():
                return backend
        raise BackendUnavailable("no profiler backend can run here", "install torch in the workload's environment")
    named = REGISTRY.get(requested)
    if named is None:
        raise BackendUnavailable(f"unknown backend {requested!r}", f"choose one of {', '.join(BACKENDS)}")
    missing = named.missing()
    if missing:
        raise BackendUnavailable(f"backend {named.name} needs {', '.join(missing)}, not found here", named.remedy)
    return named


def captured_by(manifest: RunManifest) -> Backend:
    """The backend whose main pass a run directory's manifest holds (ProfileFormatError when none does)."""
    for backend in REGISTRY.values():
        if manifest.pass_named(backend.main_pass) is not None:
            return backend
    raise ProfileFormatError("the run directory holds no capture pass", "re-run `operator-profiler profile`")
