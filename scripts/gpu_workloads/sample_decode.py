"""Sample text from a small GPT whose attention is written by hand (q @ k^T, softmax, @ v) and whose KV cache grows
by torch.cat; every step reads `.item()` to stop once each sequence has produced the end token. A plain script
(argparse, `__main__`): `run --script sample_decode.py --window-fn generate -- --calls 12`."""
import argparse
import math

import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.qkv, self.o = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, cache):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.h)
        if t > 1:
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = att.softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, d)), (k, v)


class Layer(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.n1, self.att, self.n2 = nn.LayerNorm(d), Attn(d, h), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, cache):
        a, cache = self.att(self.n1(x), cache)
        x = x + a
        return x + self.mlp(self.n2(x)), cache


class GPT(nn.Module):
    def __init__(self, vocab=8000, d=512, h=8, layers=6):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(1024, d)
        self.layers = nn.ModuleList(Layer(d, h) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids, start, caches):
        x = self.emb(ids) + self.pos(torch.arange(start, start + ids.shape[1], device=ids.device))
        new = []
        for layer, cache in zip(self.layers, caches, strict=True):
            x, c = layer(x, cache)
            new.append(c)
        return self.head(self.norm(x[:, -1])), new


@torch.no_grad()
def generate(model, prompt, steps, eos=0, top_k=50):
    logits, caches = model(prompt, 0, [None] * len(model.layers))
    out, done = [prompt], torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    pos = prompt.shape[1]
    for _ in range(steps):
        vals, idx = logits.topk(top_k, -1)
        nxt = idx.gather(-1, torch.multinomial(vals.softmax(-1), 1))
        out.append(nxt)
        done |= nxt.squeeze(1) == eos
        if done.all().item():
            break
        logits, caches = model(nxt, pos, caches)
        pos += 1
    return torch.cat(out, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT().to(device).eval()
    prompt = torch.randint(1, 8000, (args.batch, 32), device=device)
    for i in range(args.calls):
        tokens = generate(model, prompt, args.new_tokens)
        print(f"call {i}: {tokens.shape[1]} tokens")


if __name__ == "__main__":
    main()
