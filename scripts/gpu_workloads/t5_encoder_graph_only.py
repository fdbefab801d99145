"""t5_encoder with its winner's lines and the whole call replayed from one CUDA graph (winner_graph.py), the attention
left as written: t5_encoder_optimized.py without its SDPA rewrite, to tell the two changes' effects apart."""

from __future__ import annotations

from t5_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, BACKEND_NAME, count_pass, winner_functions  # noqa: F401

optimize, prepare_inputs = winner_functions(channels_last=False, cudnn_benchmark=False)
