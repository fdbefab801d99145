"""An arbitrary script (no get_model_and_input) that marks its own measured window with NvtxCapture."""

import torch

from mcp_server.children.script import NvtxCapture

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval().to(device)
x = torch.randn(8, 16, device=device)
with torch.no_grad(), NvtxCapture(warmup_iters=2, warmup_fn=lambda: model(x)):
    model(x)
