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
# How bench's child runs a baseline (the engine's `free` picks among them)
BASELINE_RECIPES = ("eager", "inductor", "reduce-overhead", "inductor-bf16", "reduce-overhead-bf16")
AUTOCAST_HOW = "under bf16 autocast"  # how bench.json's `how_run` names a recipe run inside bf16 autocast
PROFILERS = ("torch", "nvtx", "kernels", "none")

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
