"""vit_small, optimized beyond the reduced tier's winner of the free frontier (a workload outside examples/).

The winner's lines as plain code and the whole call replayed from one CUDA graph: winner_graph.py, shared with the
other own model's optimized workload here.
"""

from __future__ import annotations

from vit_small import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, BACKEND_NAME, optimize, prepare_inputs  # noqa: F401 - the contract's names
