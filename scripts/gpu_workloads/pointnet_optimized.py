"""pointnet, optimized beyond the reduced tier's winner of the free frontier (a workload outside examples/).

Its winner on the H200 was `reduce-overhead+fp16-autocast` (`optimize --tier reduced`, 2026-11-29): those lines as
plain code, and each shared per-point MLP's last layer (1x1 `Conv1d`, eval-mode BatchNorm, ReLU) with the max over
the points as one Triton kernel that never writes the 1,024-channel activation
(knowledge/fx_patterns/max_epilogue.py): in the winner's profile that activation was written by the convolution and
read back by Inductor's max-pool reduction, 71 % of the kernel time between them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from pointnet import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch.utils._pytree import tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from max_epilogue import APPLIED, fuse_conv_max  # noqa: E402 - the pattern's own code

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module, fuse: bool = True) -> Any:
    """The winner's lines, each pointwise convolution's max pool fused first (unless not `fuse`: the winner alone);
    each call's outputs its own (a CUDA graph replay overwrites them)."""
    if fuse:
        model, APPLIED_PASSES[APPLIED] = fuse_conv_max(model)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    APPLIED_PASSES["inductor"] = 1
    compiled = torch.compile(model, mode="reduce-overhead")

    def run(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16):
            out = compiled(*args, **kwargs)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)  # replays overwrite outputs

    return run
