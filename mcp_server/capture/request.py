"""What one capture pass runs: the workload, its interpreter, the window's options and the pass's scheduling,
and the harness command line that says so."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from mcp_server.children.contract import CONTRACT, SCRIPT_WINDOW
from mcp_server.errors import UsageError, WorkloadError
from mcp_server.process import child_command
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import DEFAULT_TIMEOUT_S, CaptureOptions
from mcp_server.schema.types import CompileMode, PassName


@dataclass
class CaptureRequest:
    """The workload contract options shared by every pass, and one pass's place in the GPU's turns."""

    workload: Path
    run_dir: RunDir
    python: str = sys.executable
    compile_mode: CompileMode = "eager"
    warmup_iters: int = 3
    iters: int = 1
    windows: int = 1
    unprofiled_windows: int = 0  # a CPU-only window timed this many times without the profiler first (torch pass)
    seed: int = 0
    train_step: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    gpu_lock: Path | None = None
    gpu_lock_after: Path | None = None
    gpu_lock_done: Path | None = None
    queue_ahead: bool = False
    graph_replay: bool = False
    import_compiler_early: bool = False
    warm_up_early: bool = False
    warm_up_after: Path | None = None  # an early warm-up waits for this file (Inductor's cache filled)
    script_args: list[str] = field(default_factory=list)
    nproc_per_node: int | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    dist_backend: str | None = None
    replay_calls: Path | None = None  # a shape-variant pass: the module calls to profile, once the plan is known

    @property
    def distributed(self) -> bool:
        """Whether the workload is launched through torchrun (one harness per rank)."""
        return self.nproc_per_node is not None

    @classmethod
    def of(cls, workload: Path, run_dir: RunDir, python: str, options: CaptureOptions) -> CaptureRequest:
        """The request of a facade call: its workload, run directory, interpreter and capture options."""
        return cls(workload=Path(workload), run_dir=run_dir, python=python, **options.model_dump())

    def check(self) -> None:
        """Reject bad input before anything runs, each with a remedy."""
        check_workload(self.workload, self.python)


def check_workload(workload: Path, python: str) -> None:
    """The workload is a .py file following the contract (or marking its own window), and the interpreter
    exists; else a one-line error with its remedy."""
    if workload.is_dir():
        raise WorkloadError(f"workload is a directory, not a .py file: {workload}",
                            "pass the .py file in it that defines get_model_and_input()")
    if not workload.is_file():
        raise WorkloadError(f"workload not found: {workload}", "pass the path of an existing .py file")
    if workload.suffix != ".py":
        raise WorkloadError(f"workload is not a .py file: {workload}", "pass a Python file")
    source = workload.read_text(encoding="utf-8", errors="replace")
    if not (CONTRACT.search(source) or SCRIPT_WINDOW.search(source)):
        raise WorkloadError(
            f"{workload} defines no get_model_and_input() and uses no NvtxCapture window",
            "add `def get_model_and_input(): return model, inputs` (see README: workload contract)",
        )
    if not (Path(python).is_file() or Path(python).name == python):
        raise UsageError(f"python interpreter not found: {python}", "pass --python PATH to an interpreter")


def harness_command(req: CaptureRequest, profiler: str, name: PassName) -> list[str]:
    """The harness invocation of pass `name` under the workload's interpreter: every file it writes is one the
    run directory names."""
    run_dir = req.run_dir
    args = [
        "--workload", str(req.workload.resolve()), "--run-dir", str(run_dir.pass_dir(name).resolve()),
        "--result", str(run_dir.harness_result(name).resolve()),
        "--profiler", profiler, "--compile-mode", req.compile_mode,
        "--warmup-iters", str(req.warmup_iters), "--iters", str(req.iters), "--seed", str(req.seed),
    ]
    if profiler in ("torch", "kernels"):
        args += ["--kineto-trace", str(run_dir.kineto_trace(name).resolve())]
    if req.windows > 1:
        args += ["--windows", str(req.windows)]
    if req.unprofiled_windows:
        args += ["--unprofiled-windows", str(req.unprofiled_windows)]
    if req.compile_mode != "eager":
        args += ["--provenance", str(run_dir.provenance(name).resolve())]
    if req.train_step:
        args.append("--train-step")
    for flag, path in (("--gpu-lock", req.gpu_lock), ("--gpu-lock-after", req.gpu_lock_after),
                       ("--gpu-lock-done", req.gpu_lock_done), ("--warm-up-after", req.warm_up_after)):
        if path is not None:
            args += [flag, str(path)]
    for flag, wanted in (("--queue-ahead", req.queue_ahead), ("--graph-replay", req.graph_replay),
                         ("--import-compiler-early", req.import_compiler_early),
                         ("--warm-up-early", req.warm_up_early)):
        if wanted:
            args.append(flag)
    for arg in req.script_args:
        args += ["--script-arg", arg]
    if req.dist_backend:
        args += ["--dist-backend", req.dist_backend]
    if req.replay_calls is not None:
        args += ["--replay-calls", str(req.replay_calls.resolve())]
    return child_command(req.python, "harness", *args)
