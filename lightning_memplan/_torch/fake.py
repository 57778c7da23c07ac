"""Fake tensors: a copy of a model, its inputs and its optimizer whose tensors have shapes, dtypes
and strides but no memory, so that a training step can be traced and forecast without allocating.

The only user of ``torch._subclasses.fake_tensor`` in the package. :func:`fake_step_args` copies a
model (on the meta device, or on a real device) into fake CPU tensors under a fresh
``FakeTensorMode``; the forecast then runs inside that mode as it runs on real tensors. Nothing the
caller passed is changed: the model is copied with its parameters and buffers replaced (ties kept:
a tensor shared by two modules stays shared), the optimizer is rebuilt on the copies.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["DATA_DEPENDENT_ERRORS", "FakeStep", "fake_step_args", "has_meta_tensors", "is_fake", "real_tensors",
           "running_nothing"]


def _data_dependent_errors() -> tuple[type[BaseException], ...]:
    from torch._subclasses import fake_tensor

    names = ("DataDependentOutputException", "DynamicOutputShapeException")
    found = [getattr(fake_tensor, n) for n in names if hasattr(fake_tensor, n)]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        found.append(GuardOnDataDependentSymNode)
    except ImportError:  # pragma: no cover - older torch
        pass
    return tuple(found)


#: Exceptions fake tensors raise where the step needs a tensor's values (``.item()``, a branch on
#: ``x.sum() > 0``, an output whose shape depends on the data).
DATA_DEPENDENT_ERRORS: tuple[type[BaseException], ...] = _data_dependent_errors()


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Within the block, tensors made are real even while a fake mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def is_fake(t: object) -> bool:
    """Whether ``t`` is a fake tensor (shapes only, no storage)."""
    return isinstance(t, FakeTensor)


def running_nothing() -> bool:
    """Whether the caller is inside :func:`fake_step_args`: the step being traced is of fake
    copies, and compiled code must not run kernels (inductor's example inputs are fake tensors of
    its own either way, so they cannot tell)."""
    return _RUNNING_NOTHING.get()


_RUNNING_NOTHING: contextvars.ContextVar[bool] = contextvars.ContextVar("memplan_running_nothing", default=False)


def has_meta_tensors(model: nn.Module, inputs: tuple[Any, ...] = ()) -> bool:
    """Whether any parameter, buffer or input tensor of ``model`` is on the meta device."""
    tensors = [*model.parameters(), *model.buffers(), *(t for t in inputs if isinstance(t, torch.Tensor))]
    return any(t.device.type == "meta" for t in tensors)


@dataclass(frozen=True)
class FakeStep:
    """The fake copies :func:`fake_step_args` made, and the mode they live in."""

    mode: FakeTensorMode
    model: nn.Module
    inputs: tuple[Any, ...]
    optimizer: torch.optim.Optimizer | None


class _Faker:
    """Makes one fake CPU tensor per distinct tensor (by identity), so ties survive the copy."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self.memo: dict[int, torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if id(t) in self.memo:
            return self.memo[id(t)]
        with self.mode:
            f = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
            if isinstance(t, nn.Parameter):
                f = nn.Parameter(f, requires_grad=t.requires_grad)
            elif t.requires_grad:
                f.requires_grad_(True)
        self.memo[id(t)] = f
        return f


def _module_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor the modules of ``model`` hold: parameters, buffers, and plain tensor attributes
    (a rotary embedding's ``original_inv_freq``), each once."""
    seen: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for t in [*m._parameters.values(), *m._buffers.values(),
                  *(v for v in vars(m).values() if isinstance(v, torch.Tensor))]:
            if t is not None:
                seen.setdefault(id(t), t)
    return list(seen.values())


def _fake_optimizer(opt: torch.optim.Optimizer, fake: _Faker) -> torch.optim.Optimizer:
    """A deep copy of ``opt`` whose parameters and state tensors are the fakes (class, hooks,
    hyperparameters and step counts kept)."""
    tensors = [p for g in opt.param_groups for p in g["params"]]
    tensors += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    memo: dict[int, Any] = {id(t): fake(t) for t in tensors}
    return copy.deepcopy(opt, memo)


@contextlib.contextmanager
def fake_step_args(model: nn.Module, inputs: tuple[Any, ...],
                   optimizer: torch.optim.Optimizer | None) -> Iterator[FakeStep]:
    """Fake CPU copies of ``model``, ``inputs`` (tensors among them) and ``optimizer``, with the
    mode active while the block runs. ``model`` keeps its class, hooks and attributes (a deep copy
    whose tensors are the fakes); ``optimizer``'s class, hyperparameters and state are kept.
    Gradients are not copied (a step starts with none)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # real tensors the step makes (an RNG state) are faked
    fake = _Faker(mode)
    memo: dict[int, Any] = {id(t): fake(t) for t in _module_tensors(model)}
    copied = copy.deepcopy(model, memo)
    for p in copied.parameters():
        p.grad = None
    fake_inputs = tuple(fake(t) if isinstance(t, torch.Tensor) else t for t in inputs)
    fake_opt = _fake_optimizer(optimizer, fake) if optimizer is not None else None
    token = _RUNNING_NOTHING.set(True)
    try:
        with mode:
            yield FakeStep(mode=mode, model=copied, inputs=fake_inputs, optimizer=fake_opt)
    finally:
        _RUNNING_NOTHING.reset(token)
