"""A free recipe applied to a workload's model and inputs, as a user would paste it (standard library and torch).

A recipe (named as `contract.recipe_parts` reads it) sets the precision flags, optionally turns on cuDNN's
autotuner, casts the whole model and its floating-point inputs (`-cast`), converts both to channels_last, and
compiles the model with torch.compile's mode, or runs each call inside torch.autocast (`-autocast`). Nothing here
times or validates: `measure.py` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from mcp_server.children.common import map_tensors
from mcp_server.children.compiling import RecordingInductor
from mcp_server.children.contract import GRAPH_MODES, MEMORY_FORMATS, recipe_parts


class NotApplicable(Exception):
    """The recipe cannot apply to this model (a cast of something that is not an nn.Module, say)."""


class Applied(NamedTuple):
    """A recipe in effect: the callable to time, how to turn the workload's inputs into its inputs, and how it
    reads in results."""

    fn: Callable[..., Any]
    prepare: Callable[[Any], Any]
    how: str
    graphs: bool  # CUDA graphs replay its calls (torch.compile's cudagraph trees): mark each step's start


def _dtype(precision: str) -> Any:
    import torch

    return torch.bfloat16 if precision.startswith("bf16") else torch.float16


def set_flags(precision: str) -> None:
    """TF32 on for matmuls and cuDNN in the tf32 precision, off in every other (fp32 means fp32)."""
    import torch

    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def apply(model: Any, name: str, device: str) -> Applied:
    """Apply recipe `name` to `model` (changed in place where the recipe casts or converts it)."""
    import torch

    mode, precision, layout, cudnn_benchmark = recipe_parts(name)
    is_module = isinstance(model, torch.nn.Module)
    if (precision.endswith("-cast") or layout) and not is_module:
        raise NotApplicable(f"the model is a {type(model).__name__}, not an nn.Module: it cannot be cast or "
                            "converted to channels_last")
    if device != "cuda" and (precision in ("tf32", "fp16-autocast", "fp16-cast") or cudnn_benchmark
                             or mode in GRAPH_MODES):
        raise NotApplicable(f"{name} needs a CUDA GPU (TF32, fp16, cuDNN and CUDA graphs are GPU features)")
    torch.backends.cudnn.benchmark = cudnn_benchmark
    set_flags(precision)
    casts: list[Callable[[Any], Any]] = []
    if precision.endswith("-cast"):
        dtype = _dtype(precision)
        model.to(dtype)
        casts.append(lambda t: t.to(dtype) if t.is_floating_point() else t)
    if layout:  # channels_last for 4-d tensors, channels_last_3d for 5-d ones
        format_name, rank = MEMORY_FORMATS[layout]
        memory_format = getattr(torch, format_name)
        model.to(memory_format=memory_format)
        casts.append(lambda t: t.contiguous(memory_format=memory_format)
                     if t.is_floating_point() and t.dim() == rank else t)

    def prepare(inputs: Any) -> Any:
        for cast in casts:
            inputs = map_tensors(cast, inputs)
        return inputs

    fn: Callable[..., Any] = model
    if mode != "eager":
        fn = torch.compile(model) if mode == "compile" else torch.compile(model, mode=mode)
    if precision.endswith("-autocast"):
        fn = _autocast(fn, device, _dtype(precision))
    return Applied(fn, prepare, name, mode in GRAPH_MODES)


def _autocast(fn: Callable[..., Any], device: str, dtype: Any) -> Callable[..., Any]:
    import torch

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=dtype):
            return fn(*args, **kwargs)

    return run


def model_facts(model: Any, inputs: Any) -> dict[str, Any]:
    """What decides which recipes apply: an nn.Module or not, convolutions, parameters, floating inputs."""
    import torch

    from mcp_server.children.common import tensors

    is_module = isinstance(model, torch.nn.Module)
    params = list(model.parameters()) if is_module else []
    found = tensors(inputs)
    return {
        "is_module": is_module,
        "has_convolution": is_module and any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()),
        "has_conv2d": is_module and any(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))
                                        for m in model.modules()),
        "has_conv3d": is_module and any(isinstance(m, (torch.nn.Conv3d, torch.nn.ConvTranspose3d))
                                        for m in model.modules()),
        "parameters": sum(p.numel() for p in params),
        "parameter_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
        "floating_inputs": sum(1 for t in found if t.is_floating_point()),
        "input_shapes": [list(t.shape) for t in found][:8],
        "inputs_form": ("dict" if isinstance(inputs, dict) else "tuple" if isinstance(inputs, (tuple, list))
                        else "tensor"),
        "dropout_in_training": [name for name, m in model.named_modules()
                                if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0
                                ][:5] if is_module else [],
    }


class RecordingRecipe(RecordingInductor):
    """A workload that applies a free recipe (its RECIPE) through its optimize(model): the torch.compile it calls there
    compiles through this recorder (`compile` as Inductor, `reduce-overhead` as Inductor with CUDA graphs), so its
    graphs' module maps are recorded as under --compile-mode inductor. An eager recipe compiles nothing; a max-autotune
    one compiles as it asks, unrecorded (its kernels keep Inductor's provenance)."""

    MODES = {"compile": "inductor", "reduce-overhead": "cudagraphs"}

    def __init__(self, module: Any, root: str, **options: Any) -> None:
        mode = recipe_parts(module.RECIPE)[0]
        super().__init__(self.MODES.get(mode, "inductor"), root, **options)
        self.recorded = mode in self.MODES
        self._apply = module.optimize

    def optimize(self, model: Any) -> Any:
        """The workload's optimize(model), its torch.compile calls compiled through this recorder."""
        import torch

        if not self.recorded:
            return self._apply(model)
        real = torch.compile

        def compile_recorded(target: Any, *args: Any, **kwargs: Any) -> Any:
            return real(target, backend=self)

        torch.compile = compile_recorded
        try:
            return self._apply(model)
        finally:
            torch.compile = real
