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
TFLOP/s), less the quantization kernels (one amax reduction and one cast per call per layer, which Inductor fuses
when the model is compiled); none on memory-bound GEMVs beyond the halved weight bytes. Precision changes: the
error is that of 3 mantissa bits on both operands: on the CPU, a two-layer MLP (random weights, 512-1024-512)
lost 4 % of its output's RMS on average, 13 % at the 99th percentile, 24 % at most; two pre-norm transformer
blocks, whose residuals carry the signal past the GEMMs, 0.7 %, 4 %, 7 %. Measured on an H200 on four Llama-style
blocks of width 2048 with SwiGLU MLPs (all 28 linears): 1.25x faster than the fp8 tier's winner (the model in bf16
with reduce-overhead), but the worst output element off by 0.45-0.48 of (|ref| + RMS) against the tier's 0.25 (p50
0.037, p99 0.18): deep gated stacks fail the tier; the CPU reference reproduces the distribution, so choose layers
there first. Validate in the fp8 tier (`FP8_RTOL`) and report the error distribution. Apply it in `optimize(model)`
after the baseline's weights are loaded; compile the result for the fused quantization. Self-contained (torch only).
"""

from __future__ import annotations

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


def to_fp8_linear(model: nn.Module, min_features: int = 256) -> list[str]:
    """Replace, in place, every eligible `nn.Linear` of `model` (`fp8_eligible`; not a child of a module in
    READS_CHILD_WEIGHTS) by an `Fp8Linear` at the same path; return the paths replaced (module paths, and so the
    profiles' module names, are unchanged). RuntimeError, before anything changes, when one of them sits on a GPU
    without FP8 tensor cores."""
    chosen = []
    for path, module in model.named_modules():
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        if type(module) is nn.Linear and fp8_eligible(module, min_features) and not isinstance(parent,
                                                                                              READS_CHILD_WEIGHTS):
            if not fp8_supported(module.weight.device):
                capability = ".".join(map(str, torch.cuda.get_device_capability(module.weight.device)))
                raise RuntimeError(f"FP8 GEMMs need a GPU of compute capability 8.9 or more (Ada, Hopper); "
                                   f"{path} is on one of {capability}: keep the reduced tier's winner")
            chosen.append((path, parent, name, module))
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
