"""search() on aot_eager traces once per checkpoint set, whatever the number of budgets."""
from __future__ import annotations

import torch
import torch.nn as nn

import lightning_memplan.compile as compile_mod
from lightning_memplan.search import search


def test_one_trace_per_checkpoint_set(monkeypatch) -> None:  # noqa: ANN001
    calls: list[float] = []
    orig = compile_mod.MemplanBackend.__call__

    def counting(self, gm, example_inputs):  # noqa: ANN001, ANN202
        calls.append(self.budget)
        return orig(self, gm, example_inputs)

    monkeypatch.setattr(compile_mod.MemplanBackend, "__call__", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
    seen = []
    result = search(model, (torch.randn(16, 64),), budgets=(1.0, 0.5, 0.1), checkpoint_sets=((), ("0",)),
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1), on_candidate=seen.append)
    assert len(calls) == 2  # one dynamo backend call (one region) per checkpoint set
    assert [(c.budget, c.checkpoint) for c in seen] == [
        (b, ck) for ck in ((), ("0",)) for b in (1.0, 0.5, 0.1)]
    assert all(c.peak_bytes is not None and c.cost is not None for c in seen), [c.note for c in seen]
    assert result.plan.candidates == tuple(seen)
