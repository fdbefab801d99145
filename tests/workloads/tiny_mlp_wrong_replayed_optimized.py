"""Deliberately wrong optimized tiny MLP: each call's output is overwritten by the next, and reading it after that
raises, as CUDA graph trees (`mode="reduce-overhead"`) do when an output is held past a later replay."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs

BACKEND_NAME = "tiny_mlp_wrong_replayed"
APPLIED_PASSES: dict[str, int] = {}
OVERWRITTEN = ("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run. To "
               "prevent overwriting, clone the tensor outside of torch.compile() or call "
               "torch.compiler.cudagraph_mark_step_begin() before each model invocation.")
METADATA = {"data_ptr", "untyped_storage", "storage_offset", "element_size", "size", "stride", "dim", "numel",
            "__get__", "is_contiguous", "__len__", "nbytes", "itemsize", "is_floating_point", "is_complex"}
REPLAYS = [0]


class ReplayedOutput(torch.Tensor):
    """An output of replay number `replay`: its data reads raise once a later replay ran."""

    replay = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        stale = [a for a in args if isinstance(a, ReplayedOutput) and a.replay != REPLAYS[0]]
        if stale and getattr(func, "__name__", "") not in METADATA:
            raise RuntimeError(OVERWRITTEN)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@torch._dynamo.register_backend(name=BACKEND_NAME)
def replaying_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """The graph as it is (the replays' memory is emulated around the compiled call)."""
    APPLIED_PASSES["graph_replay"] = APPLIED_PASSES.get("graph_replay", 0) + 1
    return gm.forward


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend, each output handed back as the latest replay's."""
    compiled = torch.compile(model, backend=BACKEND_NAME)

    def replay(*inputs: Any) -> torch.Tensor:
        REPLAYS[0] += 1
        out = compiled(*inputs).as_subclass(ReplayedOutput)
        out.replay = REPLAYS[0]
        return out

    return replay
