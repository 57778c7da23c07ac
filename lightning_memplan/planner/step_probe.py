"""One run of ``training_step`` outside ``fit``, to see what a step does before planning it.

:func:`called_module` finds the module the step plans (``self(...)``, or ``self.model(**batch)``),
:func:`forward_arguments` the arguments the step passes it, and :func:`probe_step` runs the step once
with that forward run without autograd, measuring the eager code after it (the loss on the outputs)
as the callback measures it on its first batch. Meanwhile the LightningModule methods that need a
running ``fit`` are stand-ins (:func:`_stand_ins`). Used by :func:`~lightning_memplan.tuner.plan_memory`
and by the batch-size search before a fit (:mod:`lightning_memplan.planner.batch_size`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_memplan._torch.storages import tree_leaves, tree_rebuilder
from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.forecasting.autograd_walk import parameters_reached
from lightning_memplan.forecasting.eager_loss import EagerCalls, measure_eager_losses
from lightning_memplan.planner.called_modules import CallWatch, ModuleCall
from lightning_memplan.planner.pipeline import StepObservation
from lightning_memplan.planner.step_model import (
    call_signature,
    fresh_input_bytes,
    input_storages,
    made_input_bytes,
    storage_keys,
)

__all__ = ["ProbedStep", "called_module", "configured_optimizers", "forward_arguments", "probe_step"]


class _OneRegion(torch.autograd.Function):
    """``outputs`` returned as they are (each a view of itself: nothing is allocated), made the outputs
    of one autograd node whose backward stops there, as a compiled region's are of its backward's
    node: a loss that is an output itself has a graph, and outputs that get no gradient are passed
    zeros (``materialize_grads``), as the compiled backward is."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, *outputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:
        return (None,) * (len(grads) + 1)


def region_outputs(out: Any) -> Any:
    """``out`` (a forward's result, computed without autograd) with its floating-point tensors made
    the outputs of one autograd node (:class:`_OneRegion`) that requires grad; the rest as it is."""
    leaves, rebuild = tree_rebuilder(out)
    at = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not at:
        return out
    anchor = torch.empty(0, device=leaves[at[0]].device, requires_grad=True)
    for i, t in zip(at, _OneRegion.apply(anchor, *(leaves[i].detach() for i in at))):
        leaves[i] = t
    return rebuild(leaves)


class _Captured(Exception):
    """Raised by the capturing forward once it has the arguments of the first call."""


def configured_optimizers(configured: Any) -> tuple[list[torch.optim.Optimizer], int]:
    """The optimizers of whatever ``configure_optimizers`` returned, and how many LR schedulers."""
    if isinstance(configured, torch.optim.Optimizer):
        return [configured], 0
    if isinstance(configured, dict):
        opts, _ = configured_optimizers(configured.get("optimizer"))
        return opts, int(configured.get("lr_scheduler") is not None)
    if isinstance(configured, (list, tuple)) and len(configured) == 2 and all(
            isinstance(c, (list, tuple)) for c in configured):
        return configured_optimizers(configured[0])[0], len(configured[1])  # ([optimizers], [schedulers])
    if isinstance(configured, (list, tuple)):
        parts = [configured_optimizers(c) for c in configured]
        return [o for opts, _ in parts for o in opts], sum(n for _, n in parts)
    return [], 0


class _StandInOptimizer:
    """What ``self.optimizers()`` returns while ``training_step`` runs outside ``fit`` (manual
    optimization): ``step`` runs only its closure, ``zero_grad`` does nothing; the rest is the
    real optimizer's (``param_groups``, ``state``)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        return None

    @contextlib.contextmanager
    def toggle_model(self, *args: Any, **kwargs: Any) -> Any:
        yield

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class _StandInScheduler:
    """What ``self.lr_schedulers()`` returns meanwhile: ``step`` does nothing."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None


def _stand_ins(model: LightningModule, losses: list[torch.Tensor]) -> list[tuple[Any, str, Any]]:
    """The LightningModule methods that need a running ``fit``, as ``training_step`` runs
    once outside it: ``self.log`` does nothing, ``self.optimizers()`` and ``self.lr_schedulers()``
    return stand-ins that step nothing, ``self.manual_backward(loss)`` appends ``loss`` to
    ``losses`` and runs no backward, ``clip_gradients`` and ``(un)toggle_optimizer`` do nothing."""
    made: list[tuple[list[_StandInOptimizer], list[_StandInScheduler]]] = []

    def configured() -> tuple[list[_StandInOptimizer], list[_StandInScheduler]]:
        if not made:  # only when training_step asks (configure_optimizers may be costly)
            optimizers, n_schedulers = configured_optimizers(model.configure_optimizers())
            made.append(([_StandInOptimizer(o) for o in optimizers], [_StandInScheduler()] * n_schedulers))
        return made[0]

    def get_optimizers(*args: Any, **kwargs: Any) -> Any:
        opts = configured()[0]
        return opts[0] if len(opts) == 1 else opts

    def get_schedulers(*args: Any, **kwargs: Any) -> Any:
        scheds = configured()[1]
        return None if not scheds else scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        losses.append(loss)

    return [(model, "log", _no_log), (model, "log_dict", _no_log), (model, "optimizers", get_optimizers),
            (model, "lr_schedulers", get_schedulers), (model, "manual_backward", manual_backward),
            (model, "clip_gradients", _no_log), (model, "toggle_optimizer", _no_log),
            (model, "untoggle_optimizer", _no_log)]


def forward_arguments(model: LightningModule, batch: Any, target: nn.Module | None = None,
                      call: str = "self(...)", api: str = "plan_memory") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments ``training_step`` passes to ``target`` (default: ``self(...)``), without running
    the step."""
    target = model if target is None else target
    captured: dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> Any:
        captured["call"] = (args, kwargs)
        raise _Captured

    try:
        with instance_attributes([(target, "forward", capture), *_stand_ins(model, [])]), torch.enable_grad():
            model.training_step(batch, 0)
    except _Captured:
        pass
    if "call" not in captured:
        raise RuntimeError(
            f"{api}: `training_step` never called the module itself (`{call}`), so there is "
            "no forward to compile. Call it in training_step, or plan the submodule you run "
            "(`submodule=\"model\"` for `self.model(x)`)."
        )
    return captured["call"]


def called_module(model: LightningModule, batch: Any, api: str = "plan_memory") -> str | None:
    """The module ``training_step`` plans, found as the callback finds it on its first batch: the
    LightningModule itself when the step calls ``self(...)`` (``None``), else the path of the first
    module with trainable parameters it calls (``self.model(**batch)``: ``"model"``); ``None`` when
    it calls neither (the caller then says so). The step runs up to that call only."""
    found: list[str | None] = []

    def at_root(*args: Any, **kwargs: Any) -> Any:
        found.append(None)
        raise _Captured

    def choose(call: ModuleCall, module: nn.Module) -> Callable[..., Any]:
        found.append(call.path)
        raise _Captured

    watch = CallWatch(model, choose)
    try:
        with instance_attributes([(model, "forward", at_root), *_stand_ins(model, [])]), torch.enable_grad():
            watch.open()
            model.training_step(batch, 0)
    except _Captured:
        pass
    finally:
        watch.close()
    if found and found[0] is not None:
        rank_zero_info(f"{api}: training_step calls `self.{found[0]}(...)`: planning {found[0]!r} "
                       "(pass `submodule=` to plan another module).")
    return found[0] if found else None


@dataclass(frozen=True)
class ProbedStep:
    """What one run of ``training_step`` showed, for the plan (see :func:`probe_step`)."""

    #: The arguments of the first call of the planned forward.
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: How the step called it; the forward ran without autograd, so the parameters reached are the
    #: eager code's (``eager_reached``) and the compiled graphs' (``Forecast.compiled_parameter_ids``).
    observed: StepObservation


def probe_step(model: LightningModule, batch: Any, target: nn.Module, device: torch.device,
               api: str = "plan_memory") -> ProbedStep | None:
    """Run ``training_step`` once as ``fit`` would, but with the planned forward run without
    autograd and its floating-point outputs made the outputs of one autograd node that requires
    grad (:func:`region_outputs`, as a compiled region's are; a loss the forward returns has a
    graph too): the loss and whatever else runs on the outputs build their autograd graph as in
    training, and are measured as the
    callback measures them on its first batch (:func:`~lightning_memplan.forecasting.eager_loss.measure_eager_losses`),
    without the forward's activations. ``self.log`` does nothing meanwhile; metric modules are
    put back as they were; under manual optimization the loss is the first ``manual_backward``'s,
    and the optimizers step nothing (:func:`_stand_ins`). ``None`` when the step does not run like
    that (a step that needs the Trainer, no loss, no call of the forward)."""
    original = target.forward
    eager = EagerCalls(device)
    inputs: list[dict[int, int]] = []
    first: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    signatures: list[tuple[Any, ...]] = []
    others: dict[tuple[Any, ...], tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def probe(*args: Any, **kwargs: Any) -> Any:
        eager.close()
        if not first:
            first.append((args, kwargs))
        inputs.append(input_storages(args, kwargs))
        signatures.append(call_signature(args, kwargs))
        if signatures[-1] != signatures[0]:
            others.setdefault(signatures[-1], (args, kwargs))
        with torch.no_grad():
            out = original(*args, **kwargs)
        out = region_outputs(out)
        eager.returned(out)
        return out

    metrics = _metric_states(model)
    backwards: list[torch.Tensor] = []
    patches = instance_attributes([(target, "forward", probe), *_stand_ins(model, backwards)])
    try:
        with patches, torch.enable_grad():
            result = model.training_step(batch, 0)
        eager.close()
        noted = eager.calls
        if model.automatic_optimization:
            loss = result.get("loss") if isinstance(result, dict) else result
        else:
            loss = backwards[0] if backwards else None
        if not first or not isinstance(loss, torch.Tensor) or loss.grad_fn is None or not any(n.edges for n in noted):
            return None
        params_and_batch = [*model.parameters(), *model.buffers(),
                            *(t for t in tree_leaves(batch) if isinstance(t, torch.Tensor))]
        # in fit only the outputs training_step returned stay alive (the loss's saved ones are found
        # by the walk); here the probe's own references may still hold others
        returned = {id(t) for t in tree_leaves(result) if isinstance(t, torch.Tensor)}
        calls = [dataclasses.replace(c, alive=[t for t in c.alive if id(t) in returned])
                 for c in eager.now()]
        losses = measure_eager_losses(loss, calls, exclude=params_and_batch, forecast_params=target.parameters(),
                                      device=device)
        before = storage_keys(batch, target)
        observed = StepObservation(
            calls=len(noted), new_input_bytes=fresh_input_bytes(inputs, len(noted), before), eager_losses=losses,
            made_input_bytes=made_input_bytes(inputs, before), eager_reached=frozenset(parameters_reached(loss)),
            backwards=len(backwards), signatures=tuple(signatures), others=others)
        return ProbedStep(args=first[0][0], kwargs=first[0][1], observed=observed)
    except Exception as exc:  # noqa: BLE001 - planned without it
        rank_zero_info(f"{api}: running training_step once to measure the loss on the outputs failed "
                       f"({exc!r}); planning the compiled forward alone.")
        return None
    finally:
        with contextlib.suppress(Exception):
            eager.close()
        _restore_metric_states(metrics)



def _no_log(*args: Any, **kwargs: Any) -> None:
    """``self.log`` while the probe runs: nothing is logged outside ``fit``."""


def _metric_states(model: nn.Module) -> list[tuple[Any, dict[str, Any]]]:
    """Copies of the state of every torchmetrics ``Metric`` in ``model`` (its ``_defaults`` names,
    update count and cached result), for :func:`_restore_metric_states`."""
    import copy

    out = []
    for m in model.modules():
        names = getattr(m, "_defaults", None)
        if isinstance(names, dict) and hasattr(m, "_update_count"):
            state = {n: copy.deepcopy(getattr(m, n)) for n in names}
            state.update(_update_count=m._update_count, _computed=copy.deepcopy(getattr(m, "_computed", None)))
            out.append((m, state))
    return out


def _restore_metric_states(saved: list[tuple[Any, dict[str, Any]]]) -> None:
    for m, state in saved:
        for n, v in state.items():
            setattr(m, n, v)
