"""Run the model's large linear layers as FP8 GEMMs through `torch._scaled_mm` (model-level, IR level: module).

`to_fp8_linear(model)` replaces each `nn.Linear` whose input and output widths are multiples of 16 (what FP8 GEMMs
need) and that has at least `min_features` of each with an `Fp8Linear` at the same path: its weight is quantized
once to float8_e4m3fn with one per-tensor scale (its absolute maximum over 448, e4m3's largest value); each call
quantizes its input the same way, with the scale of that call's absolute maximum, and `torch._scaled_mm` multiplies
in FP8 on the tensor cores, accumulates in float32 and writes bfloat16 (float16 for float16 inputs), the bias added
in the output's dtype. The output returns in the input's dtype. Smaller layers, and the rest of the model, are left
as they are.

When to apply: the `fp8` precision tier (chosen by the user: it trades accuracy for speed beyond bf16), on a GPU
with FP8 tensor cores (compute capability 8.9 or more: Ada, Hopper), when bf16/fp16 GEMMs still dominate the
window after the reduced tier's winner (a `half_matmul` finding), with layers wide enough for the GEMM's time to
outweigh the two quantizations (each reads the tensor once).

Trigger metrics (profile.json / analysis.json): a `half_matmul` finding; `flops_by_precision` mostly `bf16`/`fp16`
on tensor cores; `tensor_hmma_active_pct` high on the top GEMMs (compute-bound at half precision).

Expected gain (estimate): up to 2x the dense bf16 tensor-core rate on the GEMMs themselves (H100: about 1979 vs 989
TFLOP/s), less the quantization kernels (one amax reduction and one cast per call per layer, which Inductor fuses when
the model is compiled); none on memory-bound GEMVs beyond the halved weight bytes. Precision changes: the error is that
of 3 mantissa bits on both operands: on the CPU, a two-layer MLP (random weights, 512-1024-512) lost 4 % of its output's
RMS on average, 13 % at the 99th percentile, 24 % at most; two pre-norm transformer blocks, whose residuals carry the
signal past the GEMMs, 0.7 %, 4 %, 7 %. Measured on an H200 on four Llama-style blocks of width 2048 with SwiGLU MLPs
(all 28 linears): 1.25x faster than the fp8 tier's winner (the model in bf16 with reduce-overhead), but the worst output
element off by 0.45-0.48 of (|ref| + RMS) against the tier's 0.25 (p50 0.037, p99 0.18): deep gated stacks fail the
tier; the CPU reference reproduces the distribution, so choose layers there first (`fp8_layer_choice`). Validate in the
fp8 tier (`FP8_RTOL`) and report the error distribution. Apply it in `optimize(model)` after the baseline's weights are
loaded; compile the result for the fused quantization. Self-contained (torch only).
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value
FP8_RTOL = 0.25  # the fp8 tier's tolerance (rtol, atol = rtol x the output's RMS); the reduced tier's is 1e-2
ALIGN = 16  # FP8 GEMMs need both widths to be multiples of 16


def _scale(tensor: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale mapping `tensor`'s absolute maximum onto FP8_MAX (a float32 scalar tensor)."""
    return (tensor.detach().abs().amax().float() / FP8_MAX).clamp(min=1e-12)


def quantize(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`tensor` in float8_e4m3fn with its per-tensor scale: tensor ≈ quantized.float() * scale."""
    scale = _scale(tensor)
    return (tensor.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """A linear layer computed as one FP8 GEMM: its weight quantized once (per-tensor scale), its input at each
    call (per-tensor scale of that call)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = quantize(linear.weight)
        self.register_buffer("weight_fp8", weight)  # (out, in) row-major: its transpose is the column-major B
        self.register_buffer("weight_scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out_dtype = torch.float16 if x.dtype == torch.float16 else torch.bfloat16
        q, scale = quantize(x.reshape(-1, self.in_features).contiguous())  # _scaled_mm: A row-major, B column-major
        bias = None if self.bias is None else self.bias.to(out_dtype)
        y = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=scale, scale_b=self.weight_scale, bias=bias,
                             out_dtype=out_dtype)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3fn per-tensor"


def fp8_eligible(linear: nn.Linear, min_features: int = 256) -> bool:
    """Whether a linear layer is worth, and fit for, an FP8 GEMM: both widths multiples of ALIGN and at least
    `min_features`."""
    widths = (linear.in_features, linear.out_features)
    return all(w % ALIGN == 0 and w >= min_features for w in widths)


# Modules that read their linear children's weights themselves (the encoder layer's fused inference fast path):
# their linears stay as they are.
READS_CHILD_WEIGHTS = (nn.TransformerEncoderLayer, nn.MultiheadAttention)


def eligible_linears(model: nn.Module, min_features: int = 256) -> list[tuple[str, nn.Module, str, nn.Linear]]:
    """(path, parent, attribute name, layer) of every `nn.Linear` of `model` an FP8 GEMM may replace: `fp8_eligible`,
    and not a child of a module in READS_CHILD_WEIGHTS."""
    found = []
    for path, module in model.named_modules():
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        if type(module) is nn.Linear and fp8_eligible(module, min_features) and not isinstance(parent,
                                                                                              READS_CHILD_WEIGHTS):
            found.append((path, parent, name, module))
    return found


def to_fp8_linear(model: nn.Module, min_features: int = 256, paths: Collection[str] | None = None) -> list[str]:
    """Replace, in place, every eligible `nn.Linear` of `model` (`eligible_linears`; among `paths` when given, e.g.
    `fp8_layer_choice`'s) by an `Fp8Linear` at the same path; return the paths replaced (module paths, and so the
    profiles' module names, are unchanged). RuntimeError, before anything changes, when one of them sits on a GPU
    without FP8 tensor cores."""
    chosen = [found for found in eligible_linears(model, min_features) if paths is None or found[0] in paths]
    for path, _, _, module in chosen:
        if not fp8_supported(module.weight.device):
            capability = ".".join(map(str, torch.cuda.get_device_capability(module.weight.device)))
            raise RuntimeError(f"FP8 GEMMs need a GPU of compute capability 8.9 or more (Ada, Hopper); "
                               f"{path} is on one of {capability}: keep the reduced tier's winner")
    for _, parent, name, module in chosen:
        setattr(parent, name, Fp8Linear(module))
    return [path for path, *_ in chosen]


def fp8_supported(device: torch.device | str = "cuda") -> bool:
    """Whether FP8 GEMMs run on `device`: a CUDA GPU of compute capability 8.9 or more, or the CPU (a reference
    implementation: correct, not fast)."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 9)


def worst_error(output: Any, reference: Any) -> float:
    """The largest |output - reference| / (|reference| + RMS of the reference) over every floating tensor of the two
    (nested tuples, lists and dicts alike): the measure `validate` holds to a tier's rtol."""
    if isinstance(reference, torch.Tensor):
        ref, out = reference.detach().double(), output.detach().double()
        return float(((out - ref).abs() / (ref.abs() + ref.pow(2).mean().sqrt())).max()) if ref.is_floating_point() \
            else 0.0
    if isinstance(reference, dict):
        return max((worst_error(output[k], v) for k, v in reference.items()), default=0.0)
    if isinstance(reference, (tuple, list)):
        return max((worst_error(o, r) for o, r in zip(output, reference, strict=True)), default=0.0)
    return 0.0


def fp8_layer_choice(model: nn.Module, inputs: tuple[Any, ...], reference: Any, rtol: float = FP8_RTOL,
                     min_features: int = 256, margin: float = 0.8) -> tuple[list[str], dict[str, float]]:
    """Which eligible linears of `model` to run in FP8 so that its worst output error against `reference` (the
    baseline's fp32 output for `inputs`) stays within `margin` x `rtol`: each layer's error alone first (the model
    in FP8 at that layer only), then layers added from the least harmful on while the whole stays within. Returns the
    paths chosen (for `to_fp8_linear(model, paths=...)`) and each layer's error alone; `model` is not changed.

    Run it where the error is the GPU's: the CPU's reference `_scaled_mm` gave an H200's error distribution on a
    decoder stack (p50, p99 alike); its sample is smaller than a large batch's, so `margin` keeps room for the worst
    element of more outputs. Costs two forwards per eligible layer at most."""
    def error(paths: Collection[str]) -> float:
        trial = copy.deepcopy(model)
        to_fp8_linear(trial, min_features, paths)
        with torch.no_grad():
            return worst_error(trial(*inputs), reference)

    alone = {path: error([path]) for path, *_ in eligible_linears(model, min_features)}
    chosen: list[str] = []
    for path in sorted(alone, key=alone.__getitem__):
        if alone[path] <= margin * rtol and error([*chosen, path]) <= margin * rtol:
            chosen.append(path)
    return chosen, alone
