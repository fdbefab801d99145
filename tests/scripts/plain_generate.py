"""A plain inference script: a tiny language model decoding greedily, one token per forward, in a `generate`
function the script calls for each prompt; nothing of Operator Profiler in it:

    operator-profiler profile --script plain_generate.py --window-fn generate --steps 1:1 -- --prompts 3
"""

import argparse

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.mix(self.embed(tokens)).mean(dim=1)
        return self.out(hidden)


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    tokens = prompt
    for _ in range(new_tokens):
        logits = model(tokens)
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM().eval()
    for number in range(args.prompts):
        prompt = torch.randint(0, 64, (2, 3 + number))
        print(generate(model, prompt, args.new_tokens).shape)


if __name__ == "__main__":
    main()
