"""Compile one training step with a :class:`~lightning_memplan.forecasting.backend.MemplanBackend` by
running its forward and backward once, leaving the model as it was, and record what the run called.

One step is: forward and loss compiled together (``loss_fn(model(*inputs))``; default
``output.sum()``), backward, then ``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``
when an optimizer is given (without one, the parameters' ``.grad`` is set back to ``None``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from lightning_memplan._torch.dynamo import isolated_compile_kwargs, with_dynamo_settings
from lightning_memplan._torch.fsdp import Fsdp2Units, fsdp2_active_unit, fsdp2_units
from lightning_memplan._torch.partitioner import eager_backward_compile
from lightning_memplan._torch.storages import held_tensors, storage_key
from lightning_memplan.core.fresh_code import fresh_function
from lightning_memplan.forecasting.backend import MemplanBackend
from lightning_memplan.forecasting.unit_compile import UnitCompile

__all__ = ["CompiledStep", "compile_step"]


@dataclass(frozen=True, kw_only=True)
class CompiledStep:
    """A training step compiled by :func:`compile_step`, and what its compiling run recorded."""

    model: nn.Module
    #: The batch, ``model(*inputs)``.
    inputs: tuple[Any, ...]
    optimizer: torch.optim.Optimizer | None
    #: ``model.parameters()``, in order.
    params: tuple[torch.Tensor, ...]
    #: One training step with the compiled plan; returns the (detached) loss.
    step: Callable[[], torch.Tensor]
    #: Wall seconds of the compiling run (forward and backward).
    compile_seconds: float
    #: The model's FSDP2 units; ``None`` without FSDP2.
    fsdp: Fsdp2Units | None
    #: Region indices the run called, in order (:attr:`MemplanBackend.executions`).
    executions: tuple[int, ...]
    #: The FSDP2 unit each of those calls ran in, aligned with ``executions`` (:attr:`MemplanBackend.owners`).
    owners: tuple[int | None, ...]
    #: ``{(position j, position i): bytes}`` of outputs that a later call's backward held last
    #: (:attr:`MemplanBackend.early_frees`).
    early: Mapping[tuple[int, int], int]
    #: ``id``s of the trainable parameters each of those calls read, aligned with ``executions``
    #: (:attr:`MemplanBackend.call_params`).
    call_params: tuple[frozenset[int], ...] = ()
    #: ``{(position k, position i): bytes}`` of outputs the eager code between calls dropped during
    #: the forward, after call ``k`` (:attr:`MemplanBackend.forward_frees`).
    forward_frees: Mapping[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    #: ``{position: bytes}`` the eager code before a call made and autograd held at it
    #: (:attr:`EagerGlue.made <lightning_memplan.forecasting.eager_glue.EagerGlue.made>`).
    glue: Mapping[int, int] = dataclasses.field(default_factory=dict)
    #: Of ``glue``, what the eager ops saved for their backward (``EagerGlue.saved``).
    glue_saved: Mapping[int, int] = dataclasses.field(default_factory=dict)


def _make_loss(model: nn.Module, loss_fn: Callable[[Any], torch.Tensor] | None) -> Callable[..., torch.Tensor]:
    """``inputs -> loss_fn(model(*inputs))`` (default ``.sum()``), a fresh code object (dynamo compiles it anew)."""

    def memplan_loss(*inputs: Any) -> torch.Tensor:
        out = model(*inputs)
        return loss_fn(out) if loss_fn is not None else out.sum()

    return fresh_function(memplan_loss)


@contextlib.contextmanager
def _no_side_effects(model: nn.Module, devices: list[int]) -> Iterator[None]:
    """Restore grads, buffers and RNG after a compile run, so ``forecast`` leaves the model as it was."""
    grads = {p: p.grad for p in model.parameters()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    for p in grads:
        p.grad = None
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            for p, g in grads.items():
                p.grad = g
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def compile_step(
    be: MemplanBackend,
    model: nn.Module,
    inputs: tuple[Any, ...],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    optimizer: torch.optim.Optimizer | None,
    regional: tuple[nn.Module, ...] = (),
) -> CompiledStep:
    """Compile one training step with ``be`` by running forward and backward once (model restored:
    gradients, buffers and the RNG; under FSDP2 the backward graphs are compiled with the forward and
    not run). With several regions, or when the run stored new state on the model's modules (a
    cache a forward makes at its first call: later calls run another graph), the run is made twice,
    the second the steady one the forecast lays out, watching where each region's outputs die
    (``be.early_frees``, ``be.forward_frees``). The optimizer is not stepped. ``regional``: submodules
    compiled on their own (:class:`UnitCompile`'s ``blocks``), in the forecast and in ``step()``."""
    # static: a forecast is of these inputs' shapes. With dynamic=None, dynamo's profile of earlier
    # compiles of the same code in this process (automatic_dynamic_local_pgo) could make it a
    # dynamic-shape graph, and AOTAutograd would mark the caller's tensors dynamic for later compiles.
    compile_kwargs = {"dynamic": False, **isolated_compile_kwargs()}
    whole = with_dynamo_settings(torch.compile(_make_loss(model, loss_fn), backend=be, **compile_kwargs))
    params = [p for p in model.parameters()]
    fsdp = fsdp2_units(model)
    groups = fsdp.groups if fsdp is not None else ()
    be.call_owner = (lambda: fsdp2_active_unit(groups)) if fsdp is not None else None
    units = UnitCompile(model, be, compile_kwargs, regional)  # FSDP2 units and regional blocks: each on its own

    def compiled(*args: Any) -> torch.Tensor:
        with units.installed():
            return whole(*args)

    def step() -> torch.Tensor:
        loss = compiled(*inputs)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        return loss.detach()

    devices = sorted({t.device.index or 0 for t in [*params, *inputs] if t.device.type == "cuda"})
    t0 = time.perf_counter()
    be.clear_recording()
    be.step_storages = {storage_key(t) for t in [*model.parameters(), *model.buffers(), *held_tensors(inputs)]}
    be.watch_eager_code = bool(regional)  # the eager code between regions: only where the frame that loops runs it
    be.recording = True  # which regions one step runs, and how often
    try:
        with _no_side_effects(model, devices):
            eager_bw = eager_backward_compile() if fsdp is not None else None
            if eager_bw is not None:
                # FSDP2: its backward hooks would reshard and reduce-scatter (inside a strategy's
                # forward, the root must stay unsharded): compile the backwards without running them
                with eager_bw:
                    compiled(*inputs)
            else:
                state = _forward_state(model)
                _backward_without_hooks(compiled(*inputs), [*params, *inputs])
                if len(be.regions) > 1 or _forward_state(model) != state:
                    # the compiling run's region outputs are held by the compiles of the later regions
                    # (their example inputs): watch where they die (be.early_frees) on a steady run.
                    # A forward that stored state on the model (a cache made at its first call) runs
                    # another graph from now on: dynamo compiles it in this run, which is the one
                    # the forecast lays out (be.executions)
                    be.clear_recording()
                    _backward_without_hooks(compiled(*inputs), [*params, *inputs])
                be.glue.settle()  # the step has run: what the eager code made is gone
    finally:
        be.recording = False
    seconds = time.perf_counter() - t0
    return CompiledStep(model=model, inputs=inputs, optimizer=optimizer, params=tuple(params), step=step,
                        compile_seconds=seconds, fsdp=fsdp, executions=tuple(be.executions),
                        owners=tuple(be.owners), early=dict(be.early_frees), call_params=tuple(be.call_params),
                        forward_frees=dict(be.forward_frees), glue=dict(be.glue.made),
                        glue_saved=dict(be.glue.saved))


def _forward_state(model: nn.Module) -> list[tuple[int, str, int]]:
    """``(module id, attribute, value id)`` of every plain attribute of ``model``'s modules (not
    their parameters, buffers or submodules, which live in dicts of their own): a forward that sets
    one (``if self.pe is None: self.pe = ...``) changes this list."""
    return [(id(m), k, id(v)) for m in model.modules() for k, v in vars(m).items()]


def _backward_without_hooks(loss: torch.Tensor, leaves: list[torch.Tensor]) -> None:
    """Run ``loss``'s backward (compiling it) without accumulating into ``.grad``.

    ``torch.autograd.grad`` stops at ``leaves`` instead of running their AccumulateGrad nodes, so the
    hooks strategies put there (DDP's gradient reducer, FSDP's post-backward reshard) do not fire:
    the forecast may run inside a strategy's forward, where those hooks must not run.
    """
    targets = [t for t in leaves if t.requires_grad]
    if not targets:
        loss.backward()
        return
    torch.autograd.grad(loss, targets, allow_unused=True)
