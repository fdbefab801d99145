"""graph_breaks, optimized for inference on the GPU in the reduced precision tier (a workload outside examples/).

The MLP with two graph breaks with its Linear and convolution weights stored in float16 once, run under float16
autocast and compiled by Inductor with CUDA graphs: fp16_graphs.py, shared with the other optimized workloads here.
"""

from __future__ import annotations

from fp16_graphs import APPLIED_PASSES, BACKEND_NAME, optimize  # noqa: F401 - the contract's names
from graph_breaks import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
