"""Greedy decoding as a model's forward, for the workload contract: decode_loop.py's GPT-2-small-sized decoder (random
weights) generates 24 tokens for 4 prompts of 32, its KV cache grown by `torch.cat`, stopping early once every sequence
has emitted the end token (the vocabulary's last id, as GPT-2's; a host read each step, as Hugging Face's `generate()`
makes). `small`: 2 layers of width 64, 8 new tokens. decode_greedy_static.py goes beyond its frontier with a static KV
cache and CUDA graphs.
"""

from __future__ import annotations

import os

import torch
from decode_loop import Decoder
from torch import nn


class Greedy(nn.Module):
    """`new_tokens` greedy steps of `decoder` after the prompt; the prompt and the generated tokens are the output."""

    def __init__(self, decoder: Decoder, new_tokens: int, eos: int) -> None:
        super().__init__()
        self.decoder, self.new_tokens, self.eos = decoder, new_tokens, eos

    @torch.no_grad()
    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        logits, past = self.decoder(prompt, None, 0)
        tokens = [prompt, logits[:, -1:].argmax(dim=-1)]
        for step in range(self.new_tokens - 1):
            if bool((tokens[-1] == self.eos).all()):  # every sequence has ended
                break
            logits, past = self.decoder(tokens[-1], past, prompt.shape[1] + step)
            tokens.append(logits[:, -1:].argmax(dim=-1))
        return torch.cat(tokens, dim=1)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The generator in eval mode and its prompts, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    vocab, width, layers, heads, new_tokens = (512, 64, 2, 2, 8) if small else (50257, 768, 12, 12, 24)
    model = Greedy(Decoder(vocab, width, layers, heads, 1024), new_tokens, eos=vocab - 1).eval().to(device)
    return model, (torch.randint(1, vocab, (4, 32), device=device),)
