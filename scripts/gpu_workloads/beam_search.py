"""A plain inference script that translates with beam search: a small encoder-decoder transformer (the encoder an
`nn.TransformerEncoder`; the decoder written here, its self-attention keys and values kept in a cache grown by
`torch.cat` and its cross-attention keys and values computed once per batch) decodes a batch of random source
sentences with beams of width `--beam`. Each step: log-softmax over the vocabulary, the beams' scores added, top-k
over the flattened beams x vocabulary, the cache, the sequences and the finished flags reordered by `index_select`,
and a host check (`bool(finished.all())`) that every beam has ended. One call of `beam_search` decodes one batch;
main calls it once per batch. Random weights: the work, not the translations, is the point. argparse and the
`__main__` guard; nothing of Operator Profiler in it. Its steps are calls of `beam_search`:

    operator-profiler run --script scripts/gpu_workloads/beam_search.py --window-fn beam_search
    operator-profiler run --script scripts/gpu_workloads/beam_search.py --window-fn beam_search --steps 2:1 -- --beam 8

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {"gpu": {"vocab": 16000, "width": 512, "heads": 8, "layers": 6, "batch": 32, "src": 64, "max_len": 32},
         "small": {"vocab": 32, "width": 16, "heads": 2, "layers": 1, "batch": 2, "src": 6, "max_len": 6}}

Cache = list[tuple[torch.Tensor, torch.Tensor]]


class DecoderLayer(nn.Module):
    """Pre-norm self-attention over the cached past, cross-attention to the source, and an MLP; one token a call."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.self_qkv, self.self_out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.cross_q, self.cross_kv = nn.Linear(width, width), nn.Linear(width, 2 * width)
        self.cross_out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, time, width) -> (batch, heads, time, width / heads)."""
        return x.view(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

    @staticmethod
    def merge(x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, time, head_dim) -> (batch, time, width)."""
        return x.transpose(1, 2).flatten(2)

    def cross_cache(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The source's keys and values for this layer's cross-attention."""
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor],
                cross: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        q, k, v = (self.split(t) for t in self.self_qkv(self.norm1(x)).chunk(3, dim=-1))
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        x = x + self.self_out(self.merge(F.scaled_dot_product_attention(q, k, v)))
        q = self.split(self.cross_q(self.norm2(x)))
        x = x + self.cross_out(self.merge(F.scaled_dot_product_attention(q, *cross)))
        return x + self.mlp(self.norm3(x)), (k, v)


class Seq2Seq(nn.Module):
    """A transformer encoder over the source and a cached decoder producing one target token's logits per step."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, max_pos: int = 512) -> None:
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(vocab, width), nn.Embedding(vocab, width)
        self.pos = nn.Embedding(max_pos, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.decoder = nn.ModuleList(DecoderLayer(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Source ids (batch, src) -> memory (batch, src, width)."""
        return self.encoder(self.src_embed(src) + self.pos(torch.arange(src.shape[1], device=src.device)))

    def step(self, token: torch.Tensor, position: int, cache: Cache,
             cross: Cache) -> tuple[torch.Tensor, Cache]:
        """The last token of each hypothesis (rows,) -> next-token logits (rows, vocab) and the grown cache."""
        x = self.tgt_embed(token)[:, None] + self.pos.weight[position]
        grown = []
        for layer, past, kv in zip(self.decoder, cache, cross, strict=True):
            x, kv_self = layer(x, past, kv)
            grown.append(kv_self)
        return self.head(self.norm(x[:, 0])), grown


@torch.no_grad()
def beam_search(model: Seq2Seq, src: torch.Tensor, beam: int, max_len: int, bos: int,
                eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode each source sentence with `beam` hypotheses; return the best (batch, <= max_len + 1) and its score."""
    batch, device = src.shape[0], src.device
    memory = model.encode(src).repeat_interleave(beam, dim=0)
    cross = [layer.cross_cache(memory) for layer in model.decoder]
    heads, head_dim = model.decoder[0].heads, memory.shape[-1] // model.decoder[0].heads
    empty = memory.new_empty(batch * beam, heads, 0, head_dim)
    cache: Cache = [(empty, empty) for _ in model.decoder]
    seqs = torch.full((batch * beam, 1), bos, dtype=torch.long, device=device)
    scores = torch.full((batch, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
    finished = torch.zeros(batch * beam, dtype=torch.bool, device=device)
    base = torch.arange(batch, device=device)[:, None] * beam
    for position in range(max_len):
        logits, cache = model.step(seqs[:, -1], position, cache, cross)
        logp = F.log_softmax(logits.float(), dim=-1)
        # a finished hypothesis only extends with eos, at no cost
        done = torch.full_like(logp, float("-inf"))
        done[:, eos] = 0.0
        logp = torch.where(finished[:, None], done, logp)
        vocab = logp.shape[-1]
        top = (scores.reshape(-1, 1) + logp).view(batch, beam * vocab).topk(beam, dim=-1)
        scores = top.values
        rows = (base + top.indices // vocab).flatten()
        tokens = (top.indices % vocab).flatten()
        cache = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]
        seqs = torch.cat([seqs.index_select(0, rows), tokens[:, None]], dim=1)
        finished = finished.index_select(0, rows) | (tokens == eos)
        if bool(finished.all()):
            break
    best = scores.argmax(dim=-1)
    return seqs.view(batch, beam, -1)[torch.arange(batch, device=device), best], scores.max(dim=-1).values


def main() -> None:
    """Translate `--batches` batches of random source sentences and print the best hypotheses' mean score."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=sizes["max_len"])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    vocab = sizes["vocab"]
    model = Seq2Seq(vocab, sizes["width"], sizes["heads"], sizes["layers"]).to(device).eval()
    bos, eos = 0, vocab - 1
    for index in range(args.batches):
        src = torch.randint(2, vocab - 1, (sizes["batch"], sizes["src"]), device=device)
        best, score = beam_search(model, src, args.beam, args.max_len, bos, eos)
        if index % 10 == 0:
            print(f"batch {index}: {best.shape[1] - 1} tokens, mean score {score.mean().item():.2f}")


if __name__ == "__main__":
    main()
