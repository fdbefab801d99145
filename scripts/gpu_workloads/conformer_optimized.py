"""conformer, optimized beyond the reduced tier's winner of the free frontier (a workload outside examples/).

Its winner on the H200 was `reduce-overhead+fp16-cast+channels-last+cudnn-benchmark` (`optimize --tier reduced`,
2026-11-29): those lines as plain code, and the whole call replayed from one CUDA graph instead of CUDA graph trees
(winner_graph.py), as the analysis of the winner's profile proposed (450 us of host work around its kernels).
"""

from __future__ import annotations

from conformer import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, BACKEND_NAME, winner_functions  # noqa: F401 - the contract's names

optimize, prepare_inputs = winner_functions(channels_last=True, cudnn_benchmark=True)
