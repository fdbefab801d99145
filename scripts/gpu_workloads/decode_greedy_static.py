"""decode_greedy beyond its frontier: the KV cache preallocated at the final length (knowledge/fx_patterns/
static_kv_cache.py), so the prompt's forward and every decode step have one shape each; each compiled by Inductor
without CUDA graphs (winner_graph.py's backend) and replayed from one `torch.cuda.CUDAGraph`
(knowledge/fx_patterns/whole_forward_graph.py); the patterns are imported from the repository, not copied. The
end-token check stays on the host, once a step, as in the baseline. The prompt's last position alone goes through the
vocabulary projection (the baseline projects all 32 and keeps the last). On a CPU the steps run eagerly over the
static cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from decode_greedy import Greedy, get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from decode_loop import Decoder  # noqa: E402
from static_kv_cache import StaticKVCache  # noqa: E402 - the patterns' own code
from whole_forward_graph import graph_whole_forward  # noqa: E402
from winner_graph import APPLIED_PASSES, BACKEND_NAME, count_pass  # noqa: E402, F401 - Inductor, no CUDA graphs


def next_token(decoder: Decoder, cache: StaticKVCache, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The decoder over `tokens` at `positions` (the prompt, or one new token), its keys and values written into
    `cache`; the greedy choice after the last position, `[batch, 1]`."""
    x = decoder.wte(tokens) + decoder.wpe(positions)
    for layer, block in enumerate(decoder.h):
        batch, length, width = x.shape
        q, k, v = block.c_attn(block.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, block.heads, width // block.heads).transpose(1, 2) for t in (q, k, v))
        y = cache.attend(layer, q, k, v, positions)
        x = x + block.c_proj(y.transpose(1, 2).reshape(batch, length, width))
        x = x + block.mlp(block.ln_2(x))
    return decoder.lm_head(decoder.ln_f(x[:, -1:])).argmax(dim=-1)


class _Decoding:
    """One (batch, final length, dtype)'s cache and its step, compiled and graphed (the graphs hold its addresses)."""

    def __init__(self, decoder: Decoder, batch: int, length: int, compiled: bool) -> None:
        block = decoder.h[0]
        weight = decoder.lm_head.weight
        self.cache = StaticKVCache(len(decoder.h), batch, block.heads, length, weight.shape[1] // block.heads,
                                   weight.dtype, weight.device)
        count_pass("static_kv_cache")

        def step(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return next_token(decoder, self.cache, tokens, positions)

        fn = torch.compile(step, backend=BACKEND_NAME, dynamic=False) if compiled else step
        self.step = graph_whole_forward(fn, on_capture=lambda: count_pass("whole_forward_graph"))


class StaticGreedy(nn.Module):
    """Greedy's decoding over a static KV cache; the same tokens out."""

    def __init__(self, greedy: Greedy, compiled: bool) -> None:
        super().__init__()
        self.greedy, self.compiled = greedy, compiled
        self._decodings: dict[tuple[int, int], _Decoding] = {}

    @torch.no_grad()
    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        greedy = self.greedy
        batch, start = prompt.shape
        key = (batch, start + greedy.new_tokens)
        if key not in self._decodings:
            self._decodings[key] = _Decoding(greedy.decoder, batch, key[1], self.compiled)
        decoding = self._decodings[key]
        slots = decoding.cache.slots
        tokens = [prompt, decoding.step(prompt, slots[:start])]
        for step in range(greedy.new_tokens - 1):
            if bool((tokens[-1] == greedy.eos).all()):  # every sequence has ended
                break
            tokens.append(decoding.step(tokens[-1], slots[start + step:start + step + 1]))
        return torch.cat(tokens, dim=1)


def optimize(model: Greedy) -> StaticGreedy:
    """The generator over a static KV cache, its steps compiled and replayed from CUDA graphs on a GPU (eager over
    the same cache on a CPU)."""
    return StaticGreedy(model, compiled=next(model.parameters()).is_cuda)
