"""A plain numerical script with no nn.Module and no optimizer: a power iteration, one `iterate` call a step, the
estimate read back every few steps."""

import argparse

import torch


def iterate(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """One step of the power iteration."""
    vector = matrix @ vector
    return vector / vector.norm()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = torch.randn(32, 32)
    matrix, vector = base @ base.T, torch.randn(32)
    for step in range(args.steps):
        vector = iterate(matrix, vector)
        if step % 4 == 3:
            print(f"step {step + 1}: {float(vector @ matrix @ vector):.3f}")


if __name__ == "__main__":
    main()
