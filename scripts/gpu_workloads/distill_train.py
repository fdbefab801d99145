"""A plain knowledge-distillation training script: a wide teacher CNN, frozen in `eval()` mode and run under
`torch.no_grad()` inside every training step, and a small student CNN trained on the sum of the KL divergence between
their temperature-softened predictions (scaled by T^2) and the cross-entropy against the labels. AdamW over the
student only; both networks and their inputs in channels_last; random labelled images from a DataLoader. argparse and
the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/distill_train.py
    operator-profiler run --script scripts/gpu_workloads/distill_train.py --steps 3:1 -- --temperature 2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"batch": 128, "image": 64, "classes": 100, "teacher": (128, 256, 512), "student": (32, 64, 128)},
         "small": {"batch": 4, "image": 16, "classes": 10, "teacher": (8, 16), "student": (4, 8)}}


def stage(cin: int, cout: int) -> nn.Sequential:
    """Two 3x3 convolutions with BatchNorm and ReLU, then a 2x2 max pool."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                         nn.MaxPool2d(2))


class ConvNet(nn.Module):
    """Images (batch, 3, H, W) -> class logits: conv stages, global average pooling, a linear head."""

    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        chans = (3, *widths)
        self.features = nn.Sequential(*[stage(a, b) for a, b in zip(chans, chans[1:], strict=False)])
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float,
                 alpha: float) -> torch.Tensor:
    """alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, labels)."""
    soft = F.kl_div(F.log_softmax(student / temperature, dim=-1), F.log_softmax(teacher / temperature, dim=-1),
                    reduction="batchmean", log_target=True)
    return alpha * temperature ** 2 * soft + (1 - alpha) * F.cross_entropy(student, labels)


def main() -> None:
    """Distill the teacher into the student for `--steps` steps and print the loss."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=sizes["batch"])
    parser.add_argument("--temperature", type=float, default=4.0)
    parser.add_argument("--alpha", type=float, default=0.7)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    images = torch.randn(args.steps * args.batch, 3, sizes["image"], sizes["image"])
    labels = torch.randint(0, sizes["classes"], (args.steps * args.batch,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    teacher = ConvNet(sizes["teacher"], sizes["classes"]).to(device, memory_format=torch.channels_last).eval()
    teacher.requires_grad_(False)
    student = ConvNet(sizes["student"], sizes["classes"]).to(device, memory_format=torch.channels_last).train()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=0.05)
    for step, (image, label) in enumerate(loader, start=1):
        image = image.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        label = label.to(device, non_blocking=True)
        with torch.no_grad():
            teacher_logits = teacher(image)
        opt.zero_grad(set_to_none=True)
        loss = distill_loss(student(image), teacher_logits, label, args.temperature, args.alpha)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
