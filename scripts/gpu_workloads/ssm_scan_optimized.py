"""ssm_scan, optimized beyond the reduced tier's winner of the free frontier (a workload outside examples/).

Its winner on the H200 was `reduce-overhead+fp16-cast` (`optimize --tier reduced`, 2026-11-29; runoff of its tier's
race, three processes each): those lines as plain code, and the whole call replayed from one CUDA graph instead of
CUDA graph trees (winner_graph.py), as the analysis of the winner's profile proposed (115.1 us of host work around
75 us of kernels: each block's 32-step scan is one fused kernel).
"""

from __future__ import annotations

from ssm_scan import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, BACKEND_NAME, winner_functions  # noqa: F401 - the contract's names

optimize, prepare_inputs = winner_functions(channels_last=False, cudnn_benchmark=False)
