"""A plain serving script whose model runs CUDA kernels of its own, compiled at start-up with NVRTC
(`torch.cuda._compile_kernel`, no compiler toolchain needed): each MLP block's bias and GELU in one kernel, registered
as a custom operator (`torch.library.custom_op`, the way PyTorch's tutorials wrap a kernel), and the logits' temperature
and clamp in a second kernel the model launches itself, raw, as one calls an extension's function. argparse and the
`__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/custom_kernel_serve.py --window-fn serve --steps 2:2

Without a GPU both kernels fall back to torch operators; `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

SIZES = {"gpu": {"width": 1024, "hidden": 4096, "blocks": 6, "batch": 512, "classes": 1000},
         "small": {"width": 16, "hidden": 32, "blocks": 2, "batch": 4, "classes": 5}}
THREADS = 256

BIAS_GELU = r"""
extern "C" __global__ void bias_gelu(const float* x, const float* bias, float* out, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = x[i] + bias[i % cols];
        out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f));
    }
}
"""
SCALE_CLAMP = r"""
extern "C" __global__ void scale_clamp(float* logits, const float* limits, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        logits[i] = fminf(fmaxf(logits[i] * limits[0], -limits[1]), limits[1]);
    }
}
"""
KERNELS: dict[str, object] = {}


def kernel(name: str, source: str) -> object:
    """The NVRTC-compiled kernel `name`, compiled once."""
    if name not in KERNELS:
        KERNELS[name] = torch.cuda._compile_kernel(source, name)
    return KERNELS[name]


@torch.library.custom_op("serve_ext::bias_gelu", mutates_args=())
def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(x + bias) over the last dimension."""
    if not x.is_cuda:
        return nn.functional.gelu(x + bias)
    out = torch.empty_like(x)
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    kernel("bias_gelu", BIAS_GELU)(grid=((x.numel() + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1),
                                   args=[x, bias, out, rows, cols])
    return out


@bias_gelu.register_fake
def _(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Block(nn.Module):
    """x + W2 GELU(W1 x + b1): the bias and GELU in the custom kernel."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden, bias=False)
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(bias_gelu(self.up(self.norm(x)), self.bias))


class Classifier(nn.Module):
    """Features (n, width) -> clamped, tempered logits (n, classes)."""

    def __init__(self, sizes: dict[str, int], temperature: float = 0.7, bound: float = 30.0) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(sizes["width"], sizes["hidden"]) for _ in range(sizes["blocks"])))
        self.head = nn.Linear(sizes["width"], sizes["classes"])
        self.register_buffer("limits", torch.tensor([1.0 / temperature, bound]))  # scale, bound

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.blocks(x)).contiguous()
        if not logits.is_cuda:
            return (logits * self.limits[0]).clamp(-self.limits[1], self.limits[1])
        kernel("scale_clamp", SCALE_CLAMP)(grid=((logits.numel() + THREADS - 1) // THREADS, 1, 1),
                                           block=(THREADS, 1, 1),
                                           args=[logits, self.limits, logits.numel()])
        return logits


def serve(model: nn.Module, requests: torch.Tensor) -> torch.Tensor:
    """Answer one batch of requests: each one's top-5 classes."""
    with torch.inference_mode():
        return model(requests).topk(5, dim=1).indices.cpu()


def main() -> None:
    """Serve `--batches` batches of random feature vectors."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Classifier(sizes).to(device).eval()
    for _ in range(args.batches):
        answers = serve(model, torch.randn(sizes["batch"], sizes["width"], device=device))
    print(f"served {args.batches} batches; last answer {answers[0].tolist()}")


if __name__ == "__main__":
    main()
