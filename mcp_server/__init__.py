"""Operator Profiler: attribute every CUDA kernel of a PyTorch workload to its operator and module."""

__version__ = "0.1.0"
