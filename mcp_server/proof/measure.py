"""One way of running one workload, measured in a fresh process of its own (`children/measure.py`).

`bench` runs two of these per round, one after the other; `recipes` runs one per recipe, several compiling at a
time, their timed windows taking turns on the GPU. Nothing compiled, captured or allocated is shared between two
measurements: each is its own interpreter (only Inductor's on-disk cache of compiled code is common to them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mcp_server.children.contract import recipe_parts
from mcp_server.errors import ProfileFormatError
from mcp_server.progress import Progress, quiet
from mcp_server.proof import run_proof_child
from mcp_server.schema.proof import Measurement
from mcp_server.schema.requests import TimingOptions

MARKER = "operator_profiler_measure:"
# torch's AOTAutograd cache keys record whether autocast is on, not its dtype (pytorch/pytorch#181564, fixed after
# torch 2.11): a graph compiled under bf16 autocast would be served to a process asking for fp16 autocast. Processes
# that run a workload under autocast therefore skip that cache (Inductor's own cache, keyed on the traced graph,
# still serves them). An optimized workload may run under autocast too: it skips that cache as well.
AUTOCAST_ENV = {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
TIMING_STARTS = f"{MARKER} timing:"


@dataclass(frozen=True)
class Way:
    """How a measurement runs the workload: as written, through a free recipe, or as an optimized workload."""

    recipe: str | None = None
    optimized: Path | None = None

    def args(self) -> list[str]:
        """The child's arguments that ask for this way."""
        if self.recipe is not None:
            return ["--recipe", self.recipe]
        if self.optimized is not None:
            return ["--optimized", str(self.optimized)]
        return []


@dataclass
class Measured:
    """A measurement child's result: its raw JSON and its wall time."""

    raw: dict[str, Any]
    wall_time_s: float

    def measurement(self, round_index: int) -> Measurement:
        """The timings as bench.json keeps them."""
        try:
            return Measurement(
                round=round_index, how_run=self.raw["how_run"], first_call_ns=int(self.raw["first_call_ns"]),
                warmup_time_ns=int(self.raw["warmup_time_ns"]), latency_ns=[int(v) for v in self.raw["latency_ns"]],
                back_to_back_ns=[float(v) for v in self.raw["back_to_back_ns"]],
                latency_blocks=[int(v) for v in self.raw.get("latency_blocks", [])],
                queued_calls=int(self.raw["queued_calls"]), wall_time_s=round(self.wall_time_s, 3),
                cpus=[int(c) for c in self.raw.get("cpus", []) if c is not None],
            )
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ProfileFormatError(f"the measurement child's result is malformed: {exc}",
                                     "report this as a bug with the child's JSON attached") from exc


def measure(
    workload: Path,
    way: Way,
    python: str,
    options: TimingOptions,
    work_dir: Path,
    name: str,
    timeout_s: float,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    gpu_lock: Path | None = None,
    validate_seeds: tuple[int, ...] = (),
    keep_failed_log: Path | None = None,
    turns: Path | None = None,
) -> Measured:
    """Run the measurement child for `workload` run `way`; its JSON and log go to `work_dir/<name>_child.*`.

    Raises WorkloadError when the child fails (a timeout included), as `run_proof_child` does; with
    `keep_failed_log`, the failed child's log is first copied there (as `<name>.log`) and the error names the copy.
    With `turns` (a FIFO), the child times its blocks when the engine writes to it (`proof/turns.py`)."""
    args = ["--workload", str(workload), *way.args(), "--seed", str(options.seed),
            "--input-sets", str(options.input_sets), "--warmup", str(options.warmup), "--calls", str(options.calls),
            "--queued", str(options.queued), "--blocks", str(options.blocks), "--budget-s", str(options.budget_s)]
    if validate_seeds:
        args += ["--validate-seeds", ",".join(map(str, validate_seeds))]
    if gpu_lock is not None:
        args += ["--gpu-lock", str(gpu_lock)]
    if turns is not None:
        args += ["--turns", str(turns)]
    t0 = time.monotonic()
    autocast = way.optimized is not None or (
        way.recipe is not None and recipe_parts(way.recipe)[1].endswith("-autocast"))
    raw = run_proof_child("measure", args, python, work_dir, name, timeout_s, progress, cancel,
                          extra_env=AUTOCAST_ENV if autocast else None, keep_failed_log=keep_failed_log)
    return Measured(raw, time.monotonic() - t0)
