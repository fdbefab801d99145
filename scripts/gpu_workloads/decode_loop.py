"""A plain inference script: greedy decoding with a KV cache from a GPT-2-small-sized decoder (random weights), the
way a user's generate loop runs; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/decode_loop.py --window-fn generate --steps 1:1 -- --calls 3

With `--hf` and transformers installed, Hugging Face's `GPT2LMHeadModel.generate()` (random init) runs instead of the
loop below: the same shapes, its own code. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, length, width = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # the KV cache grows by one position per decoded token
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.c_proj(y.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln_2(x)), [k, v]


class Decoder(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers)) if p.dim() > 1 else None

    def forward(self, tokens: torch.Tensor, past: list[list[torch.Tensor]] | None, start: int
                ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        caches = []
        for i, block in enumerate(self.h):
            x, cache = block(x, past[i] if past is not None else None)
            caches.append(cache)
        return self.lm_head(self.ln_f(x)), caches


@torch.no_grad()
def generate(model: Decoder, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding: the prompt in one forward, then one forward per new token over the cache."""
    logits, past = model(prompt, None, 0)
    tokens = [prompt, logits[:, -1:].argmax(dim=-1)]
    for step in range(new_tokens - 1):
        logits, past = model(tokens[-1], past, prompt.shape[1] + step)
        tokens.append(logits[:, -1:].argmax(dim=-1))
    return torch.cat(tokens, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3, help="generate() calls (the first warms up)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--hf", action="store_true", help="Hugging Face GPT2LMHeadModel.generate() instead")
    args = parser.parse_args()
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    vocab, width, layers, heads = (512, 64, 2, 2) if small else (50257, 768, 12, 12)
    prompt = torch.randint(0, vocab, (args.batch, args.prompt), device=device)
    if args.hf:
        from transformers import GPT2Config, GPT2LMHeadModel

        hf = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab)).eval()
        hf = hf.to(device)
        for _ in range(args.calls):
            out = hf.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    else:
        model = Decoder(vocab, width, layers, heads, 1024).eval().to(device)
        for _ in range(args.calls):
            out = generate(model, prompt, args.new_tokens)
    print(f"decoded {tuple(out.shape)}")


if __name__ == "__main__":
    main()
