"""`HarnessResult`: harness.json, what the capture harness (run under the workload's interpreter, standard library
only) writes of one pass, read by the engine through this one model.

The harness writes plain JSON (it cannot import pydantic); the fields the engine reads are typed here, and every
other key it writes is kept as it is (`extra="allow"`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcp_server.errors import ProfileFormatError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class HarnessError(_Open):
    """Why the harness's pass failed."""

    kind: str | None = Field(default=None, description="no_torch, contract, not_cached, workload_raised, ...")
    message: str = "unknown error"
    traceback_tail: str = ""
    remedy: str | None = None


class HarnessWindow(_Open):
    """The measured window as the harness timed it."""

    wall_time_ns: int = 0
    gpu_elapsed_ns: int | None = None
    iters: int = 1
    profiler_start_ns: int | None = None
    profiler_stop_ns: int | None = None
    queued_ahead: bool | None = None
    graph_replay: bool | None = None
    pinned_host_bytes: int | None = Field(
        default=None, description="Pinned host memory PyTorch's host allocator held as the window began (in use and "
        "cached): ncu restores it before each replay pass of every kernel.")


class TimedWindow(_Open):
    """One of the timing pass's windows."""

    wall_time_ns: int | None = None
    gpu_elapsed_ns: int | None = None


class HarnessResult(_Open):
    """harness.json of one pass."""

    status: str = Field(default="running", description="ok, error, or running (the process never finished).")
    phase: str = "import"
    error: HarnessError | None = None
    workload_kind: str | None = Field(default=None, description="contract, script (NvtxCapture) or steps (a script "
                                      "run as it is, its window chosen by its steps).")
    artifacts: list[str] = Field(default_factory=list, description="Files written, relative to the pass's folder.")
    warnings: list[str] = Field(default_factory=list)
    environment: dict[str, Any] = Field(default_factory=dict)
    window: HarnessWindow | None = None
    windows: list[TimedWindow] | None = None
    traced_windows: list[TimedWindow] | None = None
    unprofiled_windows: list[TimedWindow] | None = Field(
        default=None, description="(without CUDA) the window timed on the host clock without the profiler: before "
        "the profiled window, or after it in a script run as it is.")
    clocks: dict[str, Any] | None = None
    root_module: str | None = None
    varying_inputs: dict[str, int] | None = Field(
        default=None, description="(a script run as it is) the models whose tensor arguments took several shapes in "
        "the measured windows, with how many; None when not recorded.")
    cudnn_benchmark: bool | None = Field(
        default=None, description="Whether cuDNN's autotuner (torch.backends.cudnn.benchmark) was on once the "
        "workload had warmed up (a script's: when it ended): each process then picks its own convolution kernels.")
    graph_breaks: list[dict[str, Any]] | None = None
    cuda_graph_trees: bool | None = Field(
        default=None, description="Whether a graph compiled in the pass runs under Inductor's CUDA graph trees "
        "(mode='reduce-overhead', triton.cudagraphs); None when nothing was compiled.")
    pageable_batches: int | None = Field(
        default=None, description="(an ncu pass) DataLoader batches left pageable rather than pinned.")
    pageable_offloads: int | None = Field(
        default=None, description="(an ncu pass) `save_on_cpu(pin_memory=True)` contexts whose activations were "
        "offloaded to pageable memory rather than pinned.")
    cpu_threads: dict[str, int] | None = Field(
        default=None, description="torch's intra-op threads held to this pass's share of the CPUs (`share`) from its "
        "own count (`own`), as the run's passes ran at once; None when unchanged.")
    distributed: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """The pass finished its window."""
        return self.status == "ok"

    @property
    def the_window(self) -> HarnessWindow:
        """The window (an empty one when the harness recorded none)."""
        return self.window if self.window is not None else HarnessWindow()

    @property
    def may_run_backward(self) -> bool:
        """Whether the window is a script's own, which may hold backward work whatever the run mode says."""
        return self.workload_kind in ("script", "steps")


def load_harness(path: Path) -> HarnessResult | None:
    """harness.json at `path`, or None when the pass never wrote it; a ProfileFormatError when it is corrupt."""
    if not path.is_file():
        return None
    try:
        return HarnessResult.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValidationError) as exc:
        raise ProfileFormatError(f"{path} is corrupt: {str(exc).splitlines()[0]}", "re-run the capture") from exc
