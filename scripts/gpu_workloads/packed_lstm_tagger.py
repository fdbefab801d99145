"""A plain training script for a sequence tagger over variable-length sentences: token embeddings, a 2-layer
bidirectional LSTM run on a `PackedSequence` (`nn.utils.rnn.pack_padded_sequence` before it,
`pad_packed_sequence` after it), a linear tag head, cross-entropy that skips the padding (`ignore_index`), SGD with
momentum and `clip_grad_norm_`. Sentence lengths are drawn at random, so every batch has its own padded length and
its own packing; a DataLoader pads each batch in its `collate_fn`. argparse and the `__main__` guard; nothing of
Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/packed_lstm_tagger.py
    operator-profiler run --script scripts/gpu_workloads/packed_lstm_tagger.py --steps 5:2 -- --max-len 64

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader

SIZES = {"gpu": {"vocab": 20000, "tags": 48, "embed": 256, "hidden": 512, "batch": 64, "min_len": 8, "max_len": 128},
         "small": {"vocab": 64, "tags": 6, "embed": 8, "hidden": 8, "batch": 4, "min_len": 2, "max_len": 10}}

PAD_TAG = -100


class Tagger(nn.Module):
    """Padded token ids (batch, time) and their lengths -> tag logits (batch, time, tags)."""

    def __init__(self, vocab: int, tags: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, padding_idx=0)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        return self.head(hidden)


def make_sentences(count: int, vocab: int, tags: int, min_len: int, max_len: int,
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` random (token ids, tags) pairs, each of a random length in [min_len, max_len]."""
    lengths = torch.randint(min_len, max_len + 1, (count,)).tolist()
    return [(torch.randint(1, vocab, (n,)), torch.randint(0, tags, (n,))) for n in lengths]


def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a batch to its longest sentence: token ids with 0, tags with PAD_TAG; return them and the lengths."""
    lengths = torch.tensor([len(tokens) for tokens, _ in batch])
    tokens = nn.utils.rnn.pad_sequence([t for t, _ in batch], batch_first=True, padding_value=0)
    tags = nn.utils.rnn.pad_sequence([t for _, t in batch], batch_first=True, padding_value=PAD_TAG)
    return tokens, tags, lengths


def main() -> None:
    """Train the tagger for `--epochs` epochs and print the loss."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=30, help="batches per epoch")
    parser.add_argument("--batch", type=int, default=sizes["batch"])
    parser.add_argument("--max-len", type=int, default=sizes["max_len"])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    data = make_sentences(args.batches * args.batch, sizes["vocab"], sizes["tags"], sizes["min_len"], args.max_len)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True, collate_fn=collate,
                        pin_memory=device == "cuda")
    model = Tagger(sizes["vocab"], sizes["tags"], sizes["embed"], sizes["hidden"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD_TAG)
    for epoch in range(args.epochs):
        for tokens, tags, lengths in loader:
            tokens, tags = tokens.to(device, non_blocking=True), tags.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            logits = model(tokens, lengths)
            loss = criterion(logits.flatten(0, 1), tags.flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
