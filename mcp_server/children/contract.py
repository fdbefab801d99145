"""What the engine and its children agree on, defined once: the workload contract, the NVTX ranges the
harness opens, its exit codes and error kinds, and the tag that marks every process of a run. Standard library
only: the engine imports this module, and the children import it under the workload's interpreter."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# A workload defines or imports get_model_and_input (an optimized workload imports its baseline's).
CONTRACT = re.compile(
    r"^\s*(?:def get_model_and_input\b|from\s+\S+\s+import\s+.*\bget_model_and_input\b"
    r"|get_model_and_input\s*=)",
    re.MULTILINE,
)
# A script without the contract marks its own window.
SCRIPT_WINDOW = re.compile(r"\bNvtxCapture\s*\(")

COMPILE_MODES = ("eager", "inductor", "cudagraphs", "optimized")
# A free recipe (`operator-profiler recipes`): what a user pastes in a few lines, named by its parts joined with
# "+" in this order: a compile mode, a precision, then optionally a layout ("channels-last" for 2-D convolutions'
# 4-d tensors, "channels-last-3d" for 3-D convolutions' 5-d ones) and "cudnn-benchmark"
# (`reduce-overhead+bf16-cast+channels-last`). "compile" is torch.compile's default mode; "fp32" keeps TF32 off
# for matmuls and cuDNN alike; "-autocast" runs the call inside torch.autocast; "-cast" casts the whole model and
# its floating-point inputs.
RECIPE_COMPILE_MODES = ("eager", "compile", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
RECIPE_PRECISIONS = ("fp32", "tf32", "bf16-autocast", "fp16-autocast", "bf16-cast", "fp16-cast")
CHANNELS_LAST, CHANNELS_LAST_3D, CUDNN_BENCHMARK = "channels-last", "channels-last-3d", "cudnn-benchmark"
LAYOUTS = (CHANNELS_LAST, CHANNELS_LAST_3D)
# a layout's torch memory format, and the rank of the tensors it lays out
MEMORY_FORMATS = {CHANNELS_LAST: ("channels_last", 4), CHANNELS_LAST_3D: ("channels_last_3d", 5)}
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the compile modes that replay CUDA graph trees


def half_dtype_name(precision: str) -> str:
    """The torch dtype, as code, of a bf16/fp16 precision (`bf16-cast`, `fp16-autocast`)."""
    return "torch.bfloat16" if precision.startswith("bf16") else "torch.float16"


def recipe_parts(name: str) -> tuple[str, str, str, bool]:
    """(compile mode, precision, layout, cudnn_benchmark) of a recipe name, the layout "" when it names none;
    ValueError naming the part that is wrong. The parts may come in any order; a missing precision is fp32."""
    parts = [p for p in name.strip().split("+") if p]
    modes = [p for p in parts if p in RECIPE_COMPILE_MODES]
    precisions = [p for p in parts if p in RECIPE_PRECISIONS]
    layouts = [p for p in parts if p in LAYOUTS]
    unknown = [p for p in parts if p not in RECIPE_COMPILE_MODES + RECIPE_PRECISIONS + LAYOUTS + (CUDNN_BENCHMARK,)]
    if unknown:
        raise ValueError(f"unknown recipe part {unknown[0]!r} in {name!r}: a recipe is a compile mode "
                         f"({', '.join(RECIPE_COMPILE_MODES)}), a precision ({', '.join(RECIPE_PRECISIONS)}) and "
                         f"optionally a layout ({', '.join(LAYOUTS)}) and {CUDNN_BENCHMARK}, joined with '+'")
    if len(modes) != 1:
        raise ValueError(f"recipe {name!r} names {len(modes)} compile modes: name exactly one of "
                         f"{', '.join(RECIPE_COMPILE_MODES)}")
    if len(precisions) > 1:
        raise ValueError(f"recipe {name!r} names {len(precisions)} precisions: name at most one")
    if len(layouts) > 1:
        raise ValueError(f"recipe {name!r} names {len(layouts)} layouts: name at most one")
    return modes[0], (precisions or ["fp32"])[0], (layouts or [""])[0], CUDNN_BENCHMARK in parts


def recipe_name(compile_mode: str, precision: str, layout: str = "", cudnn_benchmark: bool = False) -> str:
    """The canonical name of a recipe (the inverse of recipe_parts)."""
    return "+".join([compile_mode, precision] + [layout] * bool(layout) + [CUDNN_BENCHMARK] * cudnn_benchmark)


def changed_part(recipe: str, other: str) -> str | None:
    """The one part of recipe `other` that `recipe` lacks when they differ in one thing only: a compile mode or a
    precision put in place of the recipe's own, or a layout or cuDNN's autotuner added (None otherwise)."""
    mine, theirs = recipe_parts(recipe), recipe_parts(other)
    changed = [i for i in range(4) if mine[i] != theirs[i]]
    if len(changed) != 1:
        return None
    i = changed[0]
    if i < 2:
        return str(theirs[i])
    if i == 2:
        return str(theirs[2]) or None
    return CUDNN_BENCHMARK if theirs[3] else None


REFERENCE_RECIPE = recipe_name("eager", "fp32")  # the workload as written, TF32 off: what every recipe is held to


def written_floor(max_rel_error: float | None) -> float:
    """The least tolerance for a model written below fp32 whose largest relative error against itself in float32
    (`numerics.written_error`) is `max_rel_error`: twice it, since two implementations may each be that far from
    fp32, in opposite directions (0 when none was measured)."""
    return 2 * max_rel_error if max_rel_error else 0.0


class Recording(NamedTuple):
    """What one `--profiler` mode of the harness records over the window: the one table its branches read."""

    torch_profiler: bool = False  # torch.profiler runs over the window; ranges are its record_function scopes
    nvtx: bool = False  # ranges are NVTX push/pop, for nsys (which starts its collection at the window)
    kernel_trace: bool = False  # a kernel-only Kineto trace and SM clock samples around an otherwise bare window
    memory: bool = False  # the CUDA caching allocator's history over the window

    @property
    def ranged(self) -> bool:
        """Whether operator, module and call-site ranges are opened (record_function or NVTX)."""
        return self.torch_profiler or self.nvtx

    @property
    def kineto(self) -> bool:
        """Whether it writes a Kineto trace (`--kineto-trace`)."""
        return self.torch_profiler or self.kernel_trace


RECORDINGS: dict[str, Recording] = {
    "torch": Recording(torch_profiler=True),  # the torch.profiler backend's main pass
    "nvtx": Recording(nvtx=True),  # the nsys backend's main pass, and ncu's replays filtered by NVTX
    "kernels": Recording(kernel_trace=True),  # the timing pass
    "none": Recording(),  # a window timed with no profiler
    "memory": Recording(memory=True),  # the memory pass
}
PROFILERS = tuple(RECORDINGS)

MEASURE_RANGE = "operator_profiler::measure"
# Around a CUDA graph the workload captures (nsys pass): the ranges open inside it name each captured kernel's
# operator, module and call site, which its replays in the window take.
GRAPH_CAPTURE_RANGE = "operator_profiler::graph_capture"
PHASE_MARKER = "operator_profiler_harness: phase "  # what the harness prints as it enters each phase
WARMUP_PHASE = "warmup"  # the phase of the warm-up iterations (steps of a script)
# what the harness prints once, at the first DataLoader batch it leaves pageable (an ncu pass: children.pinned)
PAGEABLE_LINE = "operator_profiler_harness: batches left pageable under ncu: "
BATCHES_ASKED = "a DataLoader asked for pinned batches"  # what follows it
OFFLOAD_ASKED = "save_on_cpu asked for pinned activations"
MODULE_RANGE_PREFIX = "module:"
# `node:<path>`: around an operator an FX GraphModule's code calls eagerly (`torch.export`'s `.module()`), the module
# its node came from. Attribution reads it as a module range; it is no call of that module (a shape-variant replay
# counts `module:` ranges alone).
NODE_RANGE_PREFIX = "node:"
# `site:<path>:<line>`: the innermost frame of the user's code (outside torch, the standard library and
# site-packages) that called a torch function: around every such call of the eager window.
SITE_RANGE_PREFIX = "site:"

EXIT_OK, EXIT_CONTRACT, EXIT_NO_TORCH, EXIT_WORKLOAD_RAISED, EXIT_NO_WINDOW, EXIT_NOT_CACHED = 0, 2, 3, 4, 5, 6
EXIT_CANNOT_WRITE = 7  # a file of the run (a trace, the result itself) could not be written: a full disk, a quota
# harness.json's error.kind
UPDATE_RANGE = "operator_profiler::update"  # such a script's code between a backward() and its next module call
# `operator_profiler::step_of:<path>`: inside an optimizer's step, the innermost module holding every parameter it
# updates: a loop with two models and an optimizer each (a GAN) has each update's work under its own model
STEP_OF_PREFIX = "operator_profiler::step_of:"
# around the closure an optimizer's step calls (`LBFGS.step(closure)`): its forward and backward, inside the step
CLOSURE_RANGE = "operator_profiler::closure"
BACKWARD_STEPS = "backward"  # --window-fn backward: a script's step is one backward() (training without torch.optim)
NO_TORCH, CONTRACT_ERROR, NOT_CACHED, WORKLOAD_RAISED = "no_torch", "contract", "not_cached", "workload_raised"
OUT_OF_MEMORY, NO_CUDA = "out_of_memory", "no_cuda"  # the workload raised torch.OutOfMemoryError; no CUDA device
CANNOT_WRITE = "cannot_write"
SPAWNS_RANKS = "spawns_ranks"  # a script run as it is starts its ranks with torch.multiprocessing.spawn
CANNOT_WRITE_LINE = "operator_profiler_harness: cannot write "  # what the harness prints when its result cannot be

# Every child the engine starts carries RUN_TAG_ENV=<engine token>.<n> in its environment, and so does everything it
# starts (ncu's and nsys's targets, torchrun's ranks, compile workers, a daemon in a session of its own): the run's
# processes are found by that tag wherever they moved. ENGINE_PID_ENV names the engine: a child whose engine dies
# (whatever killed it) stops every process of its tag.
RUN_TAG_ENV = "OPERATOR_PROFILER_RUN_TAG"
ENGINE_PID_ENV = "OPERATOR_PROFILER_ENGINE_PID"


def tagged_processes(tag: str, prefix: bool = False) -> list[int]:
    """The live processes (not this one) whose environment carries RUN_TAG_ENV=`tag`, or with `prefix` a tag that
    starts with `tag`. Read from /proc: processes of other users, and zombies (their environment is gone), are
    not seen."""
    wanted = f"{RUN_TAG_ENV}={tag}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                variables = handle.read().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(wanted) if prefix else v == wanted for v in variables):
            found.append(int(entry))
    return found


def process_command(pid: int, limit: int = 120) -> str:
    """A process's command line, shortened to `limit` characters ('' when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    text = " ".join(w.decode("utf-8", "replace") for w in words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def process_group(pid: int) -> int | None:
    """The process group of `pid` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


# The harness's command line, declared once: the engine writes it from this table (`harness_argv`) and the harness
# parses it with the parser this table makes (`harness_parser`). `kind`: "path", "int", "str", "choice" (one of
# `choices`), "switch" (present or not) or "repeat" (a list, the flag given once per item).
@dataclass(frozen=True)
class HarnessFlag:
    """One flag of the harness's command line."""

    name: str
    kind: str
    help: str
    default: object = None
    required: bool = False
    choices: tuple[str, ...] = ()

    @property
    def spelling(self) -> str:
        """`--name-with-dashes`."""
        return "--" + self.name.replace("_", "-")


HARNESS_FLAGS: tuple[HarnessFlag, ...] = (
    HarnessFlag("workload", "path", "the workload's .py file", required=True),
    HarnessFlag("run_dir", "path", "this pass's directory (scratch files, Inductor's generated code)", required=True),
    HarnessFlag("result", "path", "where to write the result JSON", required=True),
    HarnessFlag("profiler", "choice", "what records the window", default="none", choices=PROFILERS),
    HarnessFlag("compile_mode", "choice", "how the model runs", default="eager", choices=COMPILE_MODES),
    HarnessFlag("warmup_iters", "int", "iterations (a script: steps) before the window", default=3),
    HarnessFlag("iters", "int", "iterations (a script: steps) inside the window", default=1),
    HarnessFlag("seed", "int", "seed of every RNG", default=0),
    HarnessFlag("kineto_trace", "path", "(--profiler torch|kernels) where to export the Kineto trace"),
    HarnessFlag("windows", "int", "measure the window this many times, each on its own (synchronised before and "
                "after)", default=1),
    HarnessFlag("unprofiled_windows", "int", "(without CUDA) before the profiled window, time this many windows "
                "without the profiler on the host clock (fewer when they take over 2 s together)", default=0),
    HarnessFlag("provenance", "path", "(compiled modes) where to write the generated kernels' provenance JSON"),
    HarnessFlag("train_step", "switch", "run the workload's train_step(model, inputs) instead of a forward"),
    HarnessFlag("gpu_lock", "path", "lock file: shared while building and warming up, exclusive for the window"),
    HarnessFlag("gpu_lock_after", "path", "compile, warm up and measure only once this file exists (the previous "
                "pass's window is done)"),
    HarnessFlag("gpu_lock_done", "path", "file written once this pass's window is done"),
    HarnessFlag("warm_up_after", "path", "(with --warm-up-early) warm up only once this file exists: the first "
                "compiling pass's window is done, so Inductor's cache holds the graphs it compiled"),
    HarnessFlag("queue_ahead", "switch", "(--profiler none) let the GPU spin while the window is enqueued, so the CUDA "
                "events time its busy time without host launch gaps"),
    HarnessFlag("graph_replay", "switch", "(--profiler none) run the window as replays of one iteration captured in a "
                "CUDA graph, so the CUDA events time its kernels with the GPU's smallest launch gaps"),
    HarnessFlag("import_compiler_early", "switch", "import TorchDynamo/Inductor before the first CUDA call (a pass "
                "started suspended at that call imports them while it waits)"),
    HarnessFlag("warm_up_early", "switch", "warm up without waiting for --gpu-lock-after (the window still waits), "
                "unless cuDNN's autotuner is on (torch.backends.cudnn.benchmark); under Inductor, compile from its "
                f"cache only: exit with code {EXIT_NOT_CACHED} before running a graph the cache did not hold"),
    HarnessFlag("script_arg", "repeat", "argument passed to a script workload (its sys.argv[1:], in order)"),
    HarnessFlag("run_script", "switch", "run the workload as a plain script, unmodified (its `__main__`), the "
                "window chosen by its steps: its loop's iterations, each ended by its last optimizer's step(), or "
                "calls of --window-fn"),
    HarnessFlag("window_fn", "str", "(--run-script) a step is one call of this function, method or nn.Module class "
                "(by name) instead of one iteration of optimizer steps; `backward`: one backward() call"),
    HarnessFlag("record_graph_capture", "switch", "(--profiler nvtx, nsys) record every CUDA graph the workload "
                "captures inside the profiler's collection, with the window's ranges open: its replays in the window "
                "take the operators and modules of their capture"),
    HarnessFlag("replay_calls", "path", "(--profiler nvtx) a JSON list of [module path, call number in the window]: "
                "profiling is on only during those calls, when the file exists once the window begins"),
    HarnessFlag("pageable_batches", "switch", "(under ncu) DataLoader batches, and activations offloaded by "
                "save_on_cpu, are not pinned: ncu restores pinned host memory before each replay pass of every "
                "kernel"),
    HarnessFlag("cpu_threads", "int", "torch's intra-op threads in this pass, at most: its share of the CPUs while "
                "the run's passes run at once"),
    HarnessFlag("dist_backend", "str", "(under torchrun) the process group's backend: nccl on CUDA, gloo on the CPU "
                "unless given"),
)


def harness_argv(values: Mapping[str, object]) -> list[str]:
    """The harness's arguments for `values` (by flag name), in the table's order: a flag whose value is None, False
    or empty is left out; a repeated flag is given once per item, as `--flag=item`."""
    known = {flag.name for flag in HARNESS_FLAGS}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KeyError(f"not harness flags: {unknown}")
    argv: list[str] = []
    for flag in HARNESS_FLAGS:
        value = values.get(flag.name)
        if value is None or value is False:
            continue
        if flag.kind == "switch":
            argv.append(flag.spelling)
        elif flag.kind == "repeat":  # `--flag=value`: a value may itself start with `-` (a script's `--lr`)
            argv += [f"{flag.spelling}={item}" for item in value]  # type: ignore[attr-defined]
        else:
            argv += [flag.spelling, str(value)]
    return argv


def harness_parser() -> argparse.ArgumentParser:
    """The harness's argument parser, made from `HARNESS_FLAGS`."""
    parser = argparse.ArgumentParser(description="Operator Profiler capture harness (runs one measured window).")
    for flag in HARNESS_FLAGS:
        if flag.kind == "switch":
            parser.add_argument(flag.spelling, dest=flag.name, action="store_true", help=flag.help)
        elif flag.kind == "repeat":
            parser.add_argument(flag.spelling, dest=flag.name, action="append", default=[], help=flag.help)
        else:
            convert = {"path": Path, "int": int}.get(flag.kind, str)
            parser.add_argument(flag.spelling, dest=flag.name, type=convert, default=flag.default,
                                required=flag.required, choices=flag.choices or None, help=flag.help)
    return parser
