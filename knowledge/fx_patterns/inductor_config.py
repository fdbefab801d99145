"""Inductor options chosen by the bottleneck (torch.compile configuration, IR level: inductor-config).

`inductor_options(bottleneck)` returns a config patch for `compile_fx(gm, example_inputs, config_patches=...)`
inside a registered backend, so the options apply to this workload's graphs only (never set them globally:
the baseline would change too). Every key is checked against `torch._inductor.config` by `check_options`.

When to apply: the graph is already compiled by Inductor and the analysis names one bottleneck class for the
kernels that hold most of the time.

Trigger metrics and expected gain (estimates) per class:
- compute (`max_autotune`, `coordinate_descent_tuning`): GEMM/conv kernels with `sm_throughput_pct` > 60 or
  `tensor_core_active_pct` > 40 holding most of the time; 1.05-1.3x on those kernels (autotuned tiles), at the
  cost of minutes of compile time.
- gemm (`max_autotune_gemm`): `max-autotune` scoped to the GEMMs, when they hold most of the time and the rest is
  left as it is: each GEMM shape timed once against Triton's templates (which fuse their epilogue) and cuBLAS;
  nothing else autotuned, so compiles take a fraction of max-autotune's.
- memory (`coordinate_descent_tuning`, `aggressive_fusion`): many Triton pointwise/reduction kernels with
  `dram_throughput_pct` > 60 and intensity < 1; 1.05-1.2x on those kernels (fewer DRAM round trips).
- launch (`triton.cudagraphs`): `gpu_busy_time_ns` / `wall_time_ns` < 0.5, mean kernel < 10 us; see cuda_graphs.py.

Not offered: `freezing` (folds parameters into constants, which the contract forbids: validation reloads
weights) and global precision switches (cast inside the graph instead, see dtype_autocast.py).
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

PRESETS: dict[str, dict[str, Any]] = {
    "compute": {"max_autotune": True, "coordinate_descent_tuning": True},
    "memory": {"coordinate_descent_tuning": True, "aggressive_fusion": True},
    "launch": {"triton.cudagraphs": True},
    "gemm": {"max_autotune_gemm": True},
}


def check_options(options: dict[str, Any]) -> None:
    """Raise KeyError naming any option that `torch._inductor.config` does not have."""
    import torch._inductor.config as config

    for key in options:
        obj: Any = config
        for part in key.split("."):
            if not hasattr(obj, part):
                raise KeyError(f"torch._inductor.config has no option {key!r} (torch {torch.__version__})")
            obj = getattr(obj, part)


def inductor_options(bottleneck: str) -> dict[str, Any]:
    """The config patch for a bottleneck class ('compute', 'memory' or 'launch'), or 'gemm' (the GEMMs alone
    autotuned)."""
    if bottleneck not in PRESETS:
        raise ValueError(f"unknown bottleneck {bottleneck!r}: choose one of {', '.join(PRESETS)}")
    options = dict(PRESETS[bottleneck])
    check_options(options)
    return options


def compile_with_options(
    gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any]
) -> Callable[..., Any]:
    """Compile a graph with Inductor under `options` (use inside a registered backend)."""
    from torch._inductor.compile_fx import compile_fx

    check_options(options)
    return compile_fx(gm, example_inputs, config_patches=options)
