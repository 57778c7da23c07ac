"""The demo's training data: plain English text shipped with the package, as character tokens.

The corpus (``lightning_memplan/demo/data/*.txt``, about 20 KB of plain prose written for this
project) is read with :mod:`importlib.resources`, so it works from a wheel too; nothing is
downloaded. Each sample is a window of ``block_size + 1`` characters: the first ``block_size`` are
the input, the last ``block_size`` the next-character targets.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["CharDataset", "CharTokenizer", "load_corpus", "make_dataloader"]


def load_corpus() -> str:
    """The shipped text: every ``demo/data/*.txt`` file, in name order, joined by blank lines."""
    root = resources.files("lightning_memplan.demo").joinpath("data")
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".txt"))
    if not names:
        raise FileNotFoundError("lightning_memplan/demo/data/*.txt is missing: reinstall the package.")
    return "\n\n".join(root.joinpath(n).read_text(encoding="utf-8") for n in names)


@dataclass(frozen=True)
class CharTokenizer:
    """Characters to ids and back; the vocabulary is the sorted set of characters of a text."""

    chars: str
    """Every character of the vocabulary, in id order."""

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """Ids of ``text`` as an int64 tensor (raises KeyError on a character not in the vocabulary)."""
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class CharDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``block_size + 1`` tokens (the last window may be dropped)."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        if block_size < 1 or ids.numel() < block_size + 1:
            raise ValueError(f"`CharDataset(block_size={block_size!r})` needs at least block_size + 1 "
                             f"tokens; the text has {ids.numel()}.")
        self._ids = ids
        self._block = block_size
        self._n = (ids.numel() - 1) // block_size

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self._block
        chunk = self._ids[start:start + self._block + 1]
        return chunk[:-1], chunk[1:]


def make_dataloader(block_size: int, batch_size: int, *, seed: int = 0,
                    text: str | None = None) -> tuple[DataLoader, CharTokenizer]:
    """A shuffled (seeded) loader over the shipped corpus, or over ``text``, and its tokenizer.
    Incomplete last batches are dropped so every step has the same shape (one compile)."""
    if batch_size < 1:
        raise ValueError(f"`make_dataloader(batch_size={batch_size!r})` must be >= 1.")
    text = load_corpus() if text is None else text
    tok = CharTokenizer.from_text(text)
    ds = CharDataset(tok.encode(text), block_size)
    if len(ds) < batch_size:
        raise ValueError(f"`make_dataloader(batch_size={batch_size!r})`: the text has only {len(ds)} "
                         f"windows of {block_size + 1} tokens.")
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    return loader, tok
