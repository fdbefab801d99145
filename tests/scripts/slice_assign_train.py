"""A plain training loop whose model writes its branches' outputs into slices of one buffer (`out[:, :4] = ...`):
autograd differentiates each such write through a `CopySlices` node.

    operator-profiler profile --script slice_assign_train.py --steps 2:1
"""

import torch
from torch import nn


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(8, 4), nn.Linear(8, 4)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(x.shape[0], 8)
        out[:, :4] = self.left(x)
        out[:, 4:] = self.right(x)
        return self.head(out)


def main() -> None:
    torch.manual_seed(0)
    model = Branches()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(6):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
