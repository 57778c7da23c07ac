"""Which blocks a checkpoint policy selects, and the scoped wrapping."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_memplan.planner.checkpointing import (
    checkpoint_candidates,
    checkpointed,
    repeated_blocks,
    resolve_blocks,
    uncompiled_blocks,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class GPTish(nn.Module):
    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(10, 8), nn.Embedding(10, 8)  # two same-class leaves
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(8, 10)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_repeated_blocks_prefers_blocks_over_leaf_layers() -> None:
    assert repeated_blocks(GPTish(2)) == ["blocks.0", "blocks.1"]
    assert repeated_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))) == []
    assert repeated_blocks(nn.Sequential(Block(), Block(), Block())) == ["0", "1", "2"]


def test_resolve_blocks_by_class_and_bad_policy() -> None:
    m = GPTish(3)
    assert resolve_blocks(m, {Block}) == ["blocks.0", "blocks.1", "blocks.2"]
    assert resolve_blocks(m, None) == []
    with pytest.raises(ValueError, match=r"`checkpoint='all'` is not a checkpoint policy"):
        resolve_blocks(m, "all")  # type: ignore[arg-type]
    assert checkpoint_candidates(["a", "b", "c"]) == [(), ("b",), ("a", "b", "c")]


def test_checkpointed_is_scoped_and_numerically_equal() -> None:
    torch.manual_seed(0)
    m = GPTish(2)
    idx = torch.randint(0, 10, (2, 5))
    ref = torch.autograd.grad(m(idx).sum(), list(m.parameters()))
    with checkpointed(m, ["blocks.0", "blocks.1"]):
        assert "forward" in m.blocks[0].__dict__
        got = torch.autograd.grad(m(idx).sum(), list(m.parameters()))
    assert all(torch.allclose(a, b) for a, b in zip(ref, got))
    assert "forward" not in m.blocks[0].__dict__
    with pytest.raises(ValueError, match=r"checkpoint block 'nope' is not a submodule"):
        with checkpointed(m, ["nope"]):
            pass


def test_uncompiled_blocks_are_those_no_compiled_graph_reads_a_parameter_of() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    frozen = model[3]
    frozen.requires_grad_(False)
    compiled = {id(p) for p in model[0].parameters()}
    # block 1 ran eagerly; the ReLU and the frozen block have no trainable parameter to tell by
    assert uncompiled_blocks(model, ["0", "1", "2", "3"], compiled) == ["1"]
    assert uncompiled_blocks(model, ["1"], None) == [] and uncompiled_blocks(model, ["1"], set()) == []

