"""A small GPT-style character language model, as a LightningModule.

Token and position embeddings, ``n_layer`` transformer blocks (pre-norm causal self-attention and
an MLP, kept in an ``nn.ModuleList`` so the planner finds them as repeated blocks), a final norm
and a language-model head. ``training_step`` calls ``self(idx)`` and applies cross-entropy, the
way most Lightning code does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

__all__ = ["GPT", "GPTConfig", "MODEL_SIZES"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Sizes of the model (counts, not bytes)."""

    vocab_size: int
    """Number of distinct tokens (characters)."""
    block_size: int = 64
    """Context length in tokens."""
    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide ``n_embd``."""
    n_embd: int = 64
    """Width of the residual stream."""
    lr: float = 3e-3
    """AdamW learning rate."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`GPTConfig({name}={value!r})` must be an int >= 1.")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"`GPTConfig(n_embd={self.n_embd!r}, n_head={self.n_head!r})`: n_embd must be a "
                "multiple of n_head.")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"`GPTConfig(lr={self.lr!r})` must be a positive number.")


MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64},
    "small": {"block_size": 128, "n_layer": 4, "n_head": 4, "n_embd": 128},
}
"""Named sizes for :meth:`GPT.from_size` (``vocab_size`` comes from the data)."""


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (``scaled_dot_product_attention`` with ``is_causal``)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(LightningModule):
    """A character-level GPT. ``forward(idx)`` maps token ids ``(batch, time)`` to logits
    ``(batch, time, vocab_size)``; ``training_step`` takes ``(idx, targets)`` batches."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    @classmethod
    def from_size(cls, size: Literal["tiny", "small"], vocab_size: int, **overrides: int | float) -> GPT:
        """A model of a named size (see :data:`MODEL_SIZES`), with optional overrides."""
        if size not in MODEL_SIZES:
            raise ValueError(f"`GPT.from_size(size={size!r})` is not a known size. Expected one of "
                             f"{sorted(MODEL_SIZES)}.")
        return cls(GPTConfig(vocab_size=vocab_size, **{**MODEL_SIZES[size], **overrides}))  # type: ignore[arg-type]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        idx, targets = batch
        logits = self(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.config.lr)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, *, temperature: float = 0.8,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Append ``new_tokens`` sampled tokens to ``idx`` ``(batch, time)``; returns the ids."""
        for _ in range(new_tokens):
            logits = self(idx[:, -self.config.block_size:])[:, -1] / temperature
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
