"""A script's own measured window: `NvtxCapture`, for a workload without `get_model_and_input()`.

    from mcp_server.children.script import NvtxCapture

    with NvtxCapture(warmup_iters=3, warmup_fn=lambda: model(x)):
        model(x)

Under `operator-profiler profile script.py` the window feeds the chosen profiler (the harness passes its
configuration in the environment); run on its own it still emits `cudaProfilerStart/Stop` and the
`operator_profiler::measure` NVTX range for nsys/ncu. Standard library and torch only.
"""

from __future__ import annotations

import json
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_server.children.common import write_json
from mcp_server.children.gpu_lock import GpuPhases
from mcp_server.children.window import MeasuredWindow

ENV_CONFIG = "OPERATOR_PROFILER_HARNESS"
_SCRIPT_PHASES: list[GpuPhases] = []  # the harness's lock, handed to the script's NvtxCapture


def _config() -> dict[str, Any]:
    """The window configuration the harness passed (empty when a script runs outside the tool)."""
    raw = os.environ.get(ENV_CONFIG)
    return json.loads(raw) if raw else {}


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


class NvtxCapture:
    """Mark the measured window of an arbitrary script: warm up, then profile the `with` body once."""

    def __init__(self, warmup_iters: int = 3, warmup_fn: Callable[[], object] | None = None) -> None:
        cfg = _config()
        self.warmup_iters = warmup_iters
        self.warmup_fn = warmup_fn
        self._window_file = _path(cfg.get("window_file"))
        self._lock_paths = (_path(cfg.get("gpu_lock")), _path(cfg.get("gpu_lock_after")),
                            _path(cfg.get("gpu_lock_done")))
        self._window = MeasuredWindow(cfg.get("profiler", "nvtx"), _path(cfg.get("kineto_trace")),
                                      on_gpu_done=self._release)

    def __enter__(self) -> NvtxCapture:
        # Under the harness, the lock it took shared while the script built its model.
        self._lock = _SCRIPT_PHASES.pop() if _SCRIPT_PHASES else GpuPhases(*self._lock_paths)
        self._lock.warmup()
        if self.warmup_fn is not None:
            for _ in range(self.warmup_iters):
                self.warmup_fn()
        self._lock.window()
        self._window.__enter__()
        return self

    def _release(self) -> None:
        self._lock.release()

    def __exit__(self, *exc: object) -> None:
        self._window.__exit__(*exc)
        self._lock.release()
        if exc[0] is None and self._window_file is not None:
            write_json(self._window_file,
                       {"wall_time_ns": self._window.wall_time_ns, "gpu_elapsed_ns": self._window.gpu_elapsed_ns})


def run_script(workload: Path, argv: list[str], config: dict[str, str], phases: GpuPhases) -> None:
    """Run an NvtxCapture script as `__main__` with `argv`; the code before its window builds under the GPU
    lock, taken shared, which the script's NvtxCapture takes over. `config` is what its NvtxCapture reads."""
    import sys

    os.environ[ENV_CONFIG] = json.dumps(config)
    phases.build()
    _SCRIPT_PHASES[:] = [phases]
    sys.argv = [str(workload), *argv]
    try:
        runpy.run_path(str(workload), run_name="__main__")
    finally:
        _SCRIPT_PHASES.clear()
        phases.close()
