"""decoder_bf16 beyond its exact tier's winner (`reduce-overhead+fp32`: the model's own bfloat16 under CUDA graph
trees), as the analysis of the winner's profile offers first: Inductor's code without graph trees, the whole call
replayed from one `torch.cuda.CUDAGraph` (knowledge/fx_patterns/whole_forward_graph.py)."""

from __future__ import annotations

from typing import Any

import torch
from decoder_bf16 import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, BACKEND_NAME, count_pass, graph_whole_forward  # noqa: F401


def optimize(model: torch.nn.Module) -> Any:
    """The bfloat16 model compiled with winner_graph's backend (Inductor, no CUDA graphs), each call replayed from
    one CUDA graph per input signature on a GPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return graph_whole_forward(torch.compile(model, backend=BACKEND_NAME),
                               on_capture=lambda: count_pass("whole_forward_graph"))
