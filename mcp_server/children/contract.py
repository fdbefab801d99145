"""What the engine and its children agree on, defined once: the workload contract, the NVTX ranges the
harness opens, its exit codes and error kinds. Standard library only: the engine imports this module, and the
children import it under the workload's interpreter."""

from __future__ import annotations

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
PROFILERS = ("torch", "nvtx", "kernels", "none", "memory")

MEASURE_RANGE = "operator_profiler::measure"
PHASE_MARKER = "operator_profiler_harness: phase "  # what the harness prints as it enters each phase
MODULE_RANGE_PREFIX = "module:"
# `site:<path>:<line>`: the innermost frame of the user's code (outside torch, the standard library and
# site-packages) that called a torch function: around every such call of the eager window.
SITE_RANGE_PREFIX = "site:"

EXIT_OK, EXIT_CONTRACT, EXIT_NO_TORCH, EXIT_WORKLOAD_RAISED, EXIT_NO_WINDOW, EXIT_NOT_CACHED = 0, 2, 3, 4, 5, 6
# harness.json's error.kind
NO_TORCH, CONTRACT_ERROR, NOT_CACHED, WORKLOAD_RAISED = "no_torch", "contract", "not_cached", "workload_raised"
OUT_OF_MEMORY, NO_CUDA = "out_of_memory", "no_cuda"  # the workload raised torch.OutOfMemoryError; no CUDA device
