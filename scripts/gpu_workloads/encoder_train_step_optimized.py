"""encoder_train_step's forward, optimized for inference on the GPU in the reduced precision tier (a workload
outside examples/).

The 4-layer transformer encoder with its Linear weights stored in float16 once, run under float16 autocast and
compiled by Inductor with CUDA graphs, its (16, 256, 512) output left in float16 as autocast returns it:
fp16_graphs.py's `optimize_keep_dtype`, shared with the other optimized workloads here. validate and bench time
forward calls; the training step itself is profiled, not benched.
"""

from __future__ import annotations

from encoder_train_step import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from fp16_graphs import APPLIED_PASSES, BACKEND_NAME  # noqa: F401 - the contract's names
from fp16_graphs import optimize_keep_dtype as optimize  # noqa: F401 - the contract's optimize(model)
