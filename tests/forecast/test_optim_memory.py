"""Optimizer state and step temporaries predicted on meta tensors vs the profiler's measurement."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
import torch.nn as nn

from lightning_memplan import measure_peak
from lightning_memplan.forecasting.optim_memory import optimizer_memory

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, foreach=True, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p),
}


def state_bytes(opt: torch.optim.Optimizer) -> int:
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def _measured_step(opt: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> int:
    """The profiler-measured peak of ``opt.step()`` plus ``zero_grad(set_to_none=True)``, with
    fresh gradients for ``params`` (bytes above those in use)."""
    for p in params:
        p.grad = torch.randn_like(p)

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return measure_peak(step, device="cpu")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_prediction_matches_measurement(name: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 32))
    opt = OPTIMIZERS[name](model.parameters())
    pred = optimizer_memory(opt)  # before the first step: state is simulated
    assert pred.state_source == "simulated" and pred.problem == ""
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert pred.state_bytes == state_bytes(opt)
    measured = _measured_step(opt, model.parameters())
    assert abs(pred.step_peak_bytes - measured) <= 64  # a few CPU scalars
    again = optimizer_memory(opt)
    assert again.state_source == ("existing" if opt.state else "simulated")  # plain SGD keeps no state
    assert again.state_bytes == pred.state_bytes


def test_optimizer_is_not_stepped() -> None:
    model = nn.Linear(4, 4)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    optimizer_memory(opt)
    assert not opt.state
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_unsimulatable_optimizer_is_reported() -> None:
    class Weird(torch.optim.SGD):
        def step(self, closure=None):  # noqa: ANN001, ANN201
            raise RuntimeError("needs real data")

    pred = optimizer_memory(Weird(nn.Linear(2, 2).parameters(), lr=0.1))
    assert pred.step_peak_bytes == 0 and "could not simulate Weird.step()" in pred.problem


def test_parameters_without_gradients_get_no_state_and_no_temporaries() -> None:
    # torch's optimizers skip a parameter whose .grad is None (a head nothing reads): it gets no
    # state and no step temporaries; optimizer_memory(gradless=...) predicts that step
    torch.manual_seed(0)
    used, unused = nn.Linear(128, 64), nn.Linear(64, 512)
    opt = torch.optim.AdamW([*used.parameters(), *unused.parameters()], foreach=True)
    every = optimizer_memory(opt)
    pred = optimizer_memory(opt, gradless={id(p) for p in unused.parameters()})
    for p in used.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert pred.state_bytes == state_bytes(opt) < every.state_bytes
    measured = _measured_step(opt, used.parameters())
    assert abs(pred.step_peak_bytes - measured) <= 64 < every.step_peak_bytes - measured
