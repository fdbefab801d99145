"""What the engine and its children agree on, defined once: the workload contract, the NVTX ranges the
harness opens, its exit codes and error kinds, and the tag that marks every process of a run. Standard library
only: the engine imports this module, and the children import it under the workload's interpreter."""

from __future__ import annotations

import os
import re

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
# "+" in this order: a compile mode, a precision, then optionally "channels-last" and "cudnn-benchmark"
# (`reduce-overhead+bf16-cast+channels-last`). "compile" is torch.compile's default mode; "fp32" keeps TF32 off
# for matmuls and cuDNN alike; "-autocast" runs the call inside torch.autocast; "-cast" casts the whole model and
# its floating-point inputs.
RECIPE_COMPILE_MODES = ("eager", "compile", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
RECIPE_PRECISIONS = ("fp32", "tf32", "bf16-autocast", "fp16-autocast", "bf16-cast", "fp16-cast")
CHANNELS_LAST, CUDNN_BENCHMARK = "channels-last", "cudnn-benchmark"


def recipe_parts(name: str) -> tuple[str, str, bool, bool]:
    """(compile mode, precision, channels_last, cudnn_benchmark) of a recipe name; ValueError naming the part that
    is wrong. The parts may come in any order; a missing precision is fp32."""
    parts = [p for p in name.strip().split("+") if p]
    modes = [p for p in parts if p in RECIPE_COMPILE_MODES]
    precisions = [p for p in parts if p in RECIPE_PRECISIONS]
    unknown = [p for p in parts if p not in RECIPE_COMPILE_MODES + RECIPE_PRECISIONS + (CHANNELS_LAST, CUDNN_BENCHMARK)]
    if unknown:
        raise ValueError(f"unknown recipe part {unknown[0]!r} in {name!r}: a recipe is a compile mode "
                         f"({', '.join(RECIPE_COMPILE_MODES)}), a precision ({', '.join(RECIPE_PRECISIONS)}) and "
                         f"optionally {CHANNELS_LAST} and {CUDNN_BENCHMARK}, joined with '+'")
    if len(modes) != 1:
        raise ValueError(f"recipe {name!r} names {len(modes)} compile modes: name exactly one of "
                         f"{', '.join(RECIPE_COMPILE_MODES)}")
    if len(precisions) > 1:
        raise ValueError(f"recipe {name!r} names {len(precisions)} precisions: name at most one")
    return modes[0], (precisions or ["fp32"])[0], CHANNELS_LAST in parts, CUDNN_BENCHMARK in parts


def recipe_name(compile_mode: str, precision: str, channels_last: bool = False, cudnn_benchmark: bool = False) -> str:
    """The canonical name of a recipe (the inverse of recipe_parts)."""
    return "+".join([compile_mode, precision] + [CHANNELS_LAST] * channels_last + [CUDNN_BENCHMARK] * cudnn_benchmark)


PROFILERS = ("torch", "nvtx", "kernels", "none", "memory")

MEASURE_RANGE = "operator_profiler::measure"
PHASE_MARKER = "operator_profiler_harness: phase "  # what the harness prints as it enters each phase
MODULE_RANGE_PREFIX = "module:"
# `site:<path>:<line>`: the innermost frame of the user's code (outside torch, the standard library and
# site-packages) that called a torch function: around every such call of the eager window.
SITE_RANGE_PREFIX = "site:"

EXIT_OK, EXIT_CONTRACT, EXIT_NO_TORCH, EXIT_WORKLOAD_RAISED, EXIT_NO_WINDOW, EXIT_NOT_CACHED = 0, 2, 3, 4, 5, 6
EXIT_CANNOT_WRITE = 7  # a file of the run (a trace, the result itself) could not be written: a full disk, a quota
# harness.json's error.kind
NO_TORCH, CONTRACT_ERROR, NOT_CACHED, WORKLOAD_RAISED = "no_torch", "contract", "not_cached", "workload_raised"
OUT_OF_MEMORY, NO_CUDA = "out_of_memory", "no_cuda"  # the workload raised torch.OutOfMemoryError; no CUDA device
CANNOT_WRITE = "cannot_write"
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
