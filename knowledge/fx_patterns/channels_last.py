"""Run 2-D convolutions in channels-last (NHWC) memory format (FX pass, IR level: functional; or a model change).

Two ways, both allowed by the optimized-workload contract:
- `convert_convs_to_channels_last(gm)`: an FX pass that makes every `conv2d` input and weight channels-last
  inside the graph (`x.contiguous(memory_format=torch.channels_last)`, a no-op for a tensor already in that
  format); convolutions then return channels-last outputs and the pointwise ops after them keep it, so only
  the graph's first input and the weights are converted.
- `channels_last_model(model, inputs)`: convert once at construction in `get_model_and_input()` (cheaper:
  weights are converted once, not per call). Parameter names do not change, so `load_state_dict` still works.
  A model whose convolutions are all 3-D (a video model's) takes `torch.channels_last_3d` (NDHWC), its 5-D inputs
  too: channels_last lays out 4-D tensors and fails on 5-D weights.

When to apply: CNNs on tensor-core GPUs in float16/bfloat16 (cuDNN's fastest convolution kernels are NHWC),
and float32 CNNs whose convolutions show layout transposes.

Trigger metrics (profile.json): convolution kernels with `nchw` in their names (e.g.
`..._nchwkcrs_nchw_...`) or separate `nchwToNhwc`/`nhwcToNchw` transpose kernels around each convolution;
`tensor_core_active_pct` low in `aten::conv2d` at reduced precision; extra kernels per convolution.

Expected gain: the layout-transpose kernels disappear and cuDNN picks NHWC tensor-core kernels: 1.1-1.5× on
convolution time at fp16/bf16, usually little at float32. Inductor already prefers channels-last for
convolutions on GPUs (`layout_optimization`), so measure before keeping it there.
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

CONV2D_TARGETS = (torch.conv2d, F.conv2d)


def _is_4d(node: Any) -> bool:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dim() == 4


def convert_convs_to_channels_last(gm: fx.GraphModule) -> int:
    """Make each 4-D `conv2d`'s input and weight channels-last inside the graph; return how many convs."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in CONV2D_TARGETS or not _is_4d(node.args[0]):
            continue
        args = list(node.args)
        with graph.inserting_before(node):
            for index in (0, 1):
                if isinstance(args[index], fx.Node):
                    args[index] = graph.call_method(
                        "contiguous", (args[index],), {"memory_format": torch.channels_last}
                    )
        node.args = tuple(args)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def channels_last_model(model: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The model and its 4-D tensor inputs converted to channels-last, or, when its convolutions are all 3-D, the
    model and its 5-D inputs to channels_last_3d (for `get_model_and_input()`)."""
    convs = [m for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    three_d = bool(convs) and all(isinstance(m, (torch.nn.Conv3d, torch.nn.ConvTranspose3d)) for m in convs)
    memory_format, rank = (torch.channels_last_3d, 5) if three_d else (torch.channels_last, 4)
    model = model.to(memory_format=memory_format)
    converted = tuple(
        x.contiguous(memory_format=memory_format) if isinstance(x, torch.Tensor) and x.dim() == rank else x
        for x in inputs
    )
    return model, converted
