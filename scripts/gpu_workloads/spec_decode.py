"""A plain script that decodes by speculative sampling: a 2-layer draft model proposes four tokens one at a time,
the 8-layer target model checks them in one forward, and the longest prefix both agree on is kept (greedy
acceptance, read back to the host with `.tolist()` every round), so every round's shapes depend on the data. Both
models keep a KV cache grown by `torch.cat` and cut back to the accepted length. argparse and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/spec_decode.py --window-fn generate --steps 1:1

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {"gpu": {"width": 768, "heads": 12, "target": 8, "draft": 2, "vocab": 8192, "prompt": 64, "new": 48},
         "small": {"width": 32, "heads": 2, "target": 2, "draft": 1, "vocab": 64, "prompt": 8, "new": 8}}
LOOKAHEAD = 4


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        past = k.shape[2] - t
        mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x)), [k, v]


class Decoder(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(1024, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None, start: int
                ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        kept = []
        for index, block in enumerate(self.blocks):
            x, cache = block(x, caches[index] if caches else None)
            kept.append(cache)
        return self.head(x), kept


def trim(caches: list[list[torch.Tensor]], length: int) -> list[list[torch.Tensor]]:
    """Each cache cut back to its first `length` positions."""
    return [[k[:, :, :length], v[:, :, :length]] for k, v in caches]


@torch.inference_mode()
def generate(target: Decoder, draft: Decoder, prompt: torch.Tensor, new: int) -> tuple[torch.Tensor, int]:
    """Greedy speculative decoding of `new` tokens after `prompt` (batch 1): (the tokens, the rounds it took)."""
    logits, target_cache = target(prompt, None, 0)
    _, draft_cache = draft(prompt, None, 0)
    tokens = torch.cat([prompt, logits[:, -1:].argmax(-1)], dim=1)
    rounds = 0
    while tokens.shape[1] < prompt.shape[1] + new:
        rounds += 1
        length = tokens.shape[1]
        proposal = tokens[:, -1:]
        draft_cache = trim(draft_cache, length - 1)
        guesses = []
        for step in range(LOOKAHEAD):
            out, draft_cache = draft(proposal, draft_cache, length - 1 + step)
            proposal = out[:, -1:].argmax(-1)
            guesses.append(proposal)
        guessed = torch.cat(guesses, dim=1)
        target_cache = trim(target_cache, length - 1)
        checked, target_cache = target(torch.cat([tokens[:, -1:], guessed], dim=1), target_cache, length - 1)
        best = checked.argmax(-1)  # the target's own choice after each position
        agree = (best[:, :LOOKAHEAD] == guessed).int().cumprod(dim=1).sum().tolist()  # the host waits here
        tokens = torch.cat([tokens, guessed[:, :agree], best[:, agree:agree + 1]], dim=1)
    return tokens, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4, help="prompts decoded, one generate() each")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    torch.manual_seed(0)
    target = Decoder(sizes["vocab"], sizes["width"], sizes["heads"], sizes["target"]).to(device).eval()
    draft = Decoder(sizes["vocab"], sizes["width"], sizes["heads"], sizes["draft"]).to(device).eval()
    with torch.no_grad():  # the draft shares the target's embeddings and head, as distilled drafts often do
        draft.embed.weight.copy_(target.embed.weight)
        draft.head.weight.copy_(target.head.weight)
    for call in range(args.calls):
        prompt = torch.randint(0, sizes["vocab"], (1, sizes["prompt"]), device=device)
        tokens, rounds = generate(target, draft, prompt, sizes["new"])
        print(f"call {call}: {tokens.shape[1] - sizes['prompt']} tokens in {rounds} rounds")


if __name__ == "__main__":
    main()
