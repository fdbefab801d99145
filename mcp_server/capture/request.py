"""What one capture pass runs, as the few objects it holds: the workload's options (what the user asked, every
pass alike), the pass's turn on the GPU (its lock files and what its window does there), and the torchrun
launch; and the harness command line that says so (its flags declared once, in `children.contract`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from mcp_server.children.contract import CONTRACT, RECORDINGS, SCRIPT_WINDOW, harness_argv
from mcp_server.errors import UsageError, WorkloadError
from mcp_server.process import child_command
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import DEFAULT_TIMEOUT_S, CaptureOptions
from mcp_server.schema.types import CompileMode, PassName


@dataclass(frozen=True)
class WorkloadOptions:
    """How the harness runs the workload's window: the same in every pass of a capture."""

    compile_mode: CompileMode = "eager"
    warmup_iters: int = 3
    iters: int = 1
    seed: int = 0
    train_step: bool = False
    script: bool = False  # run the file unmodified as a script; its steps choose the window
    script_args: tuple[str, ...] = ()
    window_fn: str | None = None  # (script) a step is a call of this function, method or module class


@dataclass(frozen=True)
class GpuTurn:
    """One pass's place in the GPU's turns (the lock file and the markers it waits for and writes), and what its
    window does in that turn."""

    lock: Path | None = None
    after: Path | None = None  # compile, warm up and measure once this file exists
    done: Path | None = None  # written once this pass's window is done
    warm_up_early: bool = False  # warm up beside the previous pass (its window still waits for `after`)
    warm_up_after: Path | None = None  # an early warm-up waits for this file (Inductor's cache filled)
    import_compiler_early: bool = False
    windows: int = 1  # how many times the window is measured
    unprofiled_windows: int = 0  # a CPU-only window timed this many times without the profiler first (torch pass)
    queue_ahead: bool = False
    graph_replay: bool = False
    replay_calls: Path | None = None  # a shape-variant pass: the module calls to profile, once the plan is known
    record_graph_capture: bool = False  # nsys: the workload's own CUDA graph captures recorded with their ranges
    pageable_batches: bool = False  # ncu: DataLoader batches left pageable (ncu restores pinned memory every pass)
    cpu_threads: int | None = None  # torch's intra-op threads, at most: passes running at once share the CPUs


@dataclass(frozen=True)
class Torchrun:
    """The torchrun launch of a multi-rank capture: one harness per rank."""

    nproc_per_node: int
    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    dist_backend: str | None = None

    def launch_flags(self) -> list[tuple[str, object]]:
        """torchrun's flags that were given (beside --nproc-per-node), as (flag, value)."""
        given = (("--nnodes", self.nnodes), ("--node-rank", self.node_rank), ("--master-addr", self.master_addr),
                 ("--master-port", self.master_port), ("--rdzv-backend", self.rdzv_backend),
                 ("--rdzv-endpoint", self.rdzv_endpoint), ("--rdzv-id", self.rdzv_id))
        return [(flag, value) for flag, value in given if value is not None]


@dataclass(frozen=True)
class CaptureRequest:
    """One pass's request: the workload, its run directory and interpreter, the workload's options, the pass's turn
    on the GPU and, for several ranks, the torchrun launch."""

    workload: Path
    run_dir: RunDir
    python: str = sys.executable
    options: WorkloadOptions = field(default_factory=WorkloadOptions)
    turn: GpuTurn = field(default_factory=GpuTurn)
    torchrun: Torchrun | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def distributed(self) -> bool:
        """Whether the workload is launched through torchrun (one harness per rank)."""
        return self.torchrun is not None

    @property
    def compile_mode(self) -> CompileMode:
        """The workload's compile mode (every pass's)."""
        return self.options.compile_mode

    def with_turn(self, **changes: object) -> CaptureRequest:
        """This request with its GPU turn changed."""
        return replace(self, turn=replace(self.turn, **changes))  # type: ignore[arg-type]

    def with_options(self, **changes: object) -> CaptureRequest:
        """This request with its workload options changed."""
        return replace(self, options=replace(self.options, **changes))  # type: ignore[arg-type]

    @classmethod
    def of(cls, workload: Path, run_dir: RunDir, python: str, options: CaptureOptions) -> CaptureRequest:
        """The request of a facade call: its workload, run directory, interpreter and capture options."""
        o = options
        torchrun = None if o.nproc_per_node is None else Torchrun(
            nproc_per_node=o.nproc_per_node, nnodes=o.nnodes, node_rank=o.node_rank, master_addr=o.master_addr,
            master_port=o.master_port, rdzv_backend=o.rdzv_backend, rdzv_endpoint=o.rdzv_endpoint,
            rdzv_id=o.rdzv_id, dist_backend=o.dist_backend)
        window = WorkloadOptions(compile_mode=o.compile_mode, warmup_iters=o.warmup_iters, iters=o.iters, seed=o.seed,
                                 train_step=o.train_step, script=o.script, script_args=tuple(o.script_args),
                                 window_fn=o.window_fn)
        return cls(workload=Path(workload), run_dir=run_dir, python=python, options=window, torchrun=torchrun,
                   timeout_s=o.timeout_s)

    def check(self) -> None:
        """Reject bad input before anything runs, each with a remedy."""
        check_workload(self.workload, self.python, self.options.script)


def check_workload(workload: Path, python: str, script: bool = False) -> None:
    """The workload is a .py file following the contract (or marking its own window, or run as a `script`), and the
    interpreter exists; else a one-line error with its remedy."""
    if workload.is_dir():
        raise WorkloadError(f"workload is a directory, not a .py file: {workload}",
                            "pass the .py file in it that defines get_model_and_input()")
    if not workload.is_file():
        raise WorkloadError(f"workload not found: {workload}", "pass the path of an existing .py file")
    if workload.suffix != ".py":
        raise WorkloadError(f"workload is not a .py file: {workload}", "pass a Python file")
    source = workload.read_text(encoding="utf-8", errors="replace")
    if not (script or CONTRACT.search(source) or SCRIPT_WINDOW.search(source)):
        raise WorkloadError(
            f"{workload} defines no get_model_and_input() and uses no NvtxCapture window",
            "add `def get_model_and_input(): return model, inputs` (see README: workload contract), or profile it "
            "as it is with --script (its optimizer steps, or --window-fn NAME, choose the window)",
        )
    if not (Path(python).is_file() or Path(python).name == python):
        raise UsageError(f"python interpreter not found: {python}", "pass --python PATH to an interpreter")


def harness_command(req: CaptureRequest, profiler: str, name: PassName) -> list[str]:
    """The harness invocation of pass `name` under the workload's interpreter: every file it writes is one the
    run directory names."""
    run_dir, options, turn = req.run_dir, req.options, req.turn
    values: dict[str, object] = {
        "workload": req.workload.resolve(), "run_dir": run_dir.pass_dir(name).resolve(),
        "result": run_dir.harness_result(name).resolve(), "profiler": profiler, "compile_mode": options.compile_mode,
        "warmup_iters": options.warmup_iters, "iters": options.iters, "seed": options.seed,
        "kineto_trace": run_dir.kineto_trace(name).resolve() if RECORDINGS[profiler].kineto else None,
        "windows": turn.windows if turn.windows > 1 else None,
        "unprofiled_windows": turn.unprofiled_windows or None,
        "provenance": run_dir.provenance(name).resolve() if options.compile_mode != "eager" or options.script
        else None,  # a script may compile its model itself
        "train_step": options.train_step,
        "gpu_lock": turn.lock, "gpu_lock_after": turn.after, "gpu_lock_done": turn.done,
        "warm_up_after": turn.warm_up_after, "queue_ahead": turn.queue_ahead, "graph_replay": turn.graph_replay,
        "import_compiler_early": turn.import_compiler_early, "warm_up_early": turn.warm_up_early,
        "script_arg": options.script_args, "run_script": options.script, "window_fn": options.window_fn,
        "dist_backend": req.torchrun.dist_backend if req.torchrun is not None else None,
        "replay_calls": turn.replay_calls.resolve() if turn.replay_calls is not None else None,
        "record_graph_capture": turn.record_graph_capture, "pageable_batches": turn.pageable_batches,
        "cpu_threads": turn.cpu_threads,
    }
    return child_command(req.python, "harness", *harness_argv(values))
