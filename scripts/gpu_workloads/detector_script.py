"""A plain inference script that compiles the one-stage detector of detector.py itself (`torch.compile(model)`), which
Dynamo cannot compile: the boolean-mask filter inside the loop over the batch makes it skip the whole forward and run
it eagerly. `run --script detector_script.py --window-fn Detector` profiles it as it is."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detector import Detector  # noqa: E402 - the model of the contract workload, unchanged


def main() -> None:
    """`--calls` compiled calls on 4 images of 512x512."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=16)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.compile(Detector().to(device).eval())
    images = torch.randn(4, 3, 512, 512, device=device)
    with torch.no_grad():
        for _ in range(args.calls):
            boxes = model(images)
    print(f"boxes {tuple(boxes.shape)}")


if __name__ == "__main__":
    main()
