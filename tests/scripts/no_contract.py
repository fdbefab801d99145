"""A Python file that is not a workload: no get_model_and_input, no NvtxCapture."""

VALUE = 3
