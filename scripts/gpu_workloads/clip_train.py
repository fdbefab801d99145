"""A plain CLIP-style contrastive training script: an image tower (a small CNN) and a text tower (token and position
embeddings, an `nn.TransformerEncoder`, the last token's state pooled), each projected to a shared unit-normalised
embedding, a learnable logit scale, and the symmetric cross-entropy over the batch's image-text similarity matrix.
One AdamW over both towers, float16 autocast with a `torch.amp.GradScaler` on CUDA, random image-caption pairs from a
DataLoader. Every `--eval-every` steps an evaluation pass under `torch.no_grad()` (the towers in eval mode) measures
image-to-text retrieval accuracy on a held-out batch and prints it (`.item()`). argparse and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/clip_train.py
    operator-profiler run --script scripts/gpu_workloads/clip_train.py --steps 4:2 -- --eval-every 5

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"batch": 128, "image": 64, "widths": (64, 128, 256, 512), "vocab": 8192, "seq": 32,
                 "text_width": 256, "heads": 4, "layers": 4, "embed": 256},
         "small": {"batch": 4, "image": 16, "widths": (4, 8), "vocab": 64, "seq": 8,
                   "text_width": 16, "heads": 2, "layers": 1, "embed": 8}}


def conv_stage(cin: int, cout: int) -> nn.Sequential:
    """Two 3x3 convolutions with BatchNorm and ReLU, the first one strided by 2."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))


class ImageTower(nn.Module):
    """Images (batch, 3, H, W) -> embeddings (batch, embed): strided conv stages, global pooling, a projection."""

    def __init__(self, widths: tuple[int, ...], embed: int) -> None:
        super().__init__()
        chans = (3, *widths)
        self.stages = nn.Sequential(*[conv_stage(a, b) for a, b in zip(chans, chans[1:], strict=False)])
        self.proj = nn.Linear(widths[-1], embed, bias=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(self.stages(images).mean((2, 3)))


class TextTower(nn.Module):
    """Token ids (batch, seq) -> embeddings (batch, embed): a transformer encoder, the last token pooled."""

    def __init__(self, vocab: int, seq: int, width: int, heads: int, layers: int, embed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.01)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, embed, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.tok(tokens) + self.pos)
        return self.proj(self.norm(x[:, -1]))


class Clip(nn.Module):
    """Both towers and the learnable temperature; returns the image-to-text logits (batch, batch)."""

    def __init__(self, sizes: dict) -> None:
        super().__init__()
        self.image = ImageTower(sizes["widths"], sizes["embed"])
        self.text = TextTower(sizes["vocab"], sizes["seq"], sizes["text_width"], sizes["heads"], sizes["layers"],
                              sizes["embed"])
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        img = F.normalize(self.image(images), dim=-1)
        txt = F.normalize(self.text(tokens), dim=-1)
        return self.logit_scale.exp().clamp(max=100) * img @ txt.t()


def contrastive_loss(logits: torch.Tensor) -> torch.Tensor:
    """The symmetric cross-entropy: each image's caption among the batch's, and each caption's image."""
    target = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


@torch.no_grad()
def evaluate(model: Clip, images: torch.Tensor, tokens: torch.Tensor, device: str) -> float:
    """Image-to-text top-1 retrieval accuracy on a held-out batch, the towers in eval mode."""
    model.eval()
    with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
        logits = model(images, tokens)
    model.train()
    target = torch.arange(logits.shape[0], device=logits.device)
    return (logits.argmax(dim=1) == target).float().mean().item()


def main() -> None:
    """Train both towers for `--steps` steps, evaluating every `--eval-every`."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=sizes["batch"])
    parser.add_argument("--eval-every", type=int, default=5)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    side, seq, vocab = sizes["image"], sizes["seq"], sizes["vocab"]
    images = torch.randn(args.steps * args.batch, 3, side, side)
    captions = torch.randint(0, vocab, (args.steps * args.batch, seq))
    loader = DataLoader(TensorDataset(images, captions), batch_size=args.batch, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    held_images = torch.randn(args.batch, 3, side, side, device=device)
    held_captions = torch.randint(0, vocab, (args.batch, seq), device=device)
    model = Clip(sizes).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    for step, (image, caption) in enumerate(loader, start=1):
        image, caption = image.to(device, non_blocking=True), caption.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            loss = contrastive_loss(model(image, caption))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step % args.eval_every == 0:
            accuracy = evaluate(model, held_images, held_captions, device)
            print(f"step {step}: loss {loss.item():.3f}, retrieval accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
