"""A Conformer-style speech encoder (16 utterances of 800 frames of 80 mel features on a GPU): conv subsampling, then
six blocks of half-step FFN, self-attention (nn.MultiheadAttention), a convolution module (pointwise conv, GLU,
depthwise conv, BatchNorm, SiLU) and a second half-step FFN."""
import torch
from torch import nn


class ConvModule(nn.Module):
    def __init__(self, d, kernel=31):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)

    def forward(self, x):
        y = self.norm(x).transpose(1, 2)
        y = nn.functional.glu(self.pw1(y), dim=1)
        y = self.pw2(nn.functional.silu(self.bn(self.dw(y))))
        return y.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__()
        self.ff1 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.norm_att = nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.conv = ConvModule(d)
        self.ff2 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.out = nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        h = self.norm_att(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.out(x)


class Conformer(nn.Module):
    def __init__(self, mels=80, d=256, blocks=6):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, d, 3, stride=2), nn.ReLU(), nn.Conv2d(d, d, 3, stride=2), nn.ReLU())
        self.proj = nn.Linear(d * (((mels - 1) // 2 - 1) // 2), d)
        self.blocks = nn.Sequential(*(Block(d) for _ in range(blocks)))

    def forward(self, feats):
        x = self.sub(feats.unsqueeze(1))
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        return self.blocks(x)


def get_model_and_input():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch, frames = (16, 800) if device.type == "cuda" else (2, 200)
    model = Conformer().to(device).eval()
    return model, (torch.randn(batch, frames, 80, device=device),)
