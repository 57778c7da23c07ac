"""Which modules a piece of code calls (lightning_memplan.planner.called_modules), without a Trainer."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightning_memplan.planner.called_modules import CallWatch, also_called, nothing_to_plan, planned_path


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 2)
        self.criterion = nn.MSELoss()


def test_outermost_calls_are_noted_and_the_first_trainable_one_is_offered() -> None:
    net = _Net()
    offered: list[str] = []

    def choose(call: Any, module: nn.Module) -> Any:
        offered.append(call.path)
        if call.path != "head":
            return None  # let it run as written; the next trainable call is offered
        return lambda x: torch.zeros(x.shape[0], 2)

    x = torch.randn(4, 8)
    with torch.no_grad():
        watch = CallWatch(net, choose).open()
        out = net.criterion(net.head(net.encoder(x)), torch.ones(4, 2))
        again = net.head(x)  # the chosen module's watch is gone: its own forward runs
        watch.close()
    assert [c.path for c in watch.calls] == ["encoder", "head", "criterion"]  # not encoder.0 (inside encoder)
    assert offered == ["encoder", "head"] and watch.chosen is not None and watch.chosen.path == "head"
    assert out.item() == 1.0  # the head's call ran the function choose returned
    assert again.abs().sum() > 0
    assert not any("forward" in m.__dict__ for m in net.modules())  # every forward as it was
    assert watch.calls[2].trainable_bytes == 0 and watch.calls[0].trainable_bytes == (8 * 16 + 16 + 16 * 8 + 8) * 4


def test_a_compiled_submodule_is_named_as_written() -> None:
    net = _Net()
    net.encoder = torch.compile(net.encoder, backend="eager")  # type: ignore[assignment]
    own = net.encoder.__dict__.get("forward")
    watch = CallWatch(net, lambda call, module: None).open()
    net.encoder(torch.randn(2, 8))
    watch.close()
    assert [c.path for c in watch.calls] == ["encoder"] and planned_path("encoder._orig_mod.0") == "encoder.0"
    assert net.encoder.__dict__.get("forward") is own  # OptimizedModule's own forward attribute put back


def test_messages_name_what_was_called() -> None:
    net = _Net()
    watch = CallWatch(net, lambda call, module: None).open()
    net.criterion(torch.zeros(2), torch.ones(2))
    watch.close()
    text = nothing_to_plan(None, watch.calls)
    assert "it called 'criterion' (MSELoss, no trainable parameters)" in text and "submodule=" in text
    assert "`self.model(...)` (`submodule='model'`)" in nothing_to_plan("model", [])

    chosen = CallWatch(net, lambda call, module: (lambda x: x)).open()
    net.head(torch.zeros(2, 8))
    net.encoder(torch.zeros(2, 8))
    chosen.close()
    said = also_called(chosen.chosen, chosen.calls)  # type: ignore[arg-type]
    assert said is not None and said[1] and "`submodule='encoder'`" in said[0]  # the larger one, named
