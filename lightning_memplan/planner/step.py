"""Plan a LightningModule's training step: validated settings, the decision, the final forecast.

Shared by :class:`~lightning_memplan.MemPlanCallback` (on the first batch of a fit) and
:func:`~lightning_memplan.tuner.plan_memory` (before a run). Works on a module, its original
``forward``, one call's arguments and the optimizer; knows nothing of the Trainer.
"""
from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from lightning_memplan._torch import compat as _compat
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import (
    CheckpointPolicy,
    _policy_classes,
    checkpoint_candidates,
    resolve_blocks,
)
from lightning_memplan.planner.search import (
    DEFAULT_BUDGETS,
    DEFAULT_REMAT_BUDGETS,
    PlanDoesNotFit,
    rejudge,
    search,
)
from lightning_memplan.units import parse_bytes

__all__ = [
    "PlanSettings", "PlanWarning", "TrainingLoop", "decide_plan", "eager_forward_warning", "forecast_plan",
    "lightning_step_memory",
    "gradless_bytes", "gradless_parameters", "lightning_step_peak", "lightning_step_timeline",
    "other_optimizer_state_bytes", "rejudge_plan",
    "step_grad_bytes",
    "uncompiled_warnings",
]


class PlanWarning(UserWarning):
    """Planning fell back or changed course; training goes on."""


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """Validated planning arguments (see :class:`~lightning_memplan.MemPlanCallback` for each)."""

    budget: float | Literal["auto"]
    max_memory: int | None
    """Byte target for baseline + step peak, or None."""
    solver: str | Callable[..., Any]
    solver_name: str
    checkpoint: Any
    """None, ``"auto"`` or a frozenset of module classes."""
    backend: Literal["inductor", "aot_eager"]
    candidate_budgets: tuple[float, ...]
    search_backend: Literal["inductor", "aot_eager"]
    remat_budgets: tuple[float, ...] = DEFAULT_REMAT_BUDGETS
    """Whole-graph rematerialization budgets the search adds (``()``: none)."""

    @classmethod
    def from_args(
        cls,
        call: str,
        *,
        budget: float | str = "auto",
        max_memory: int | str | None = None,
        solver: str | Callable[..., Any] = "dp",
        checkpoint: CheckpointPolicy = "auto",
        backend: str = "inductor",
        candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
        search_backend: str = "aot_eager",
        remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
    ) -> PlanSettings:
        """Validate the arguments of ``call`` (named in every error message)."""
        from lightning_memplan.forecasting.backend import (
            _check_budget,
            _check_inner,
            resolve_solver,
        )

        if isinstance(budget, str):
            if budget != "auto":
                close = difflib.get_close_matches(budget.lower(), ["auto"], n=1, cutoff=0.5)
                hint = " Did you mean 'auto'?" if close else ""
                raise ValueError(
                    f"`{call}(budget={budget!r})` is not valid. Expected a float in [0.0, 1.0] or "
                    f"'auto'.{hint}"
                )
        else:
            budget = _check_budget(budget, call)
        max_bytes = None if max_memory is None else parse_bytes(max_memory, argument="max_memory")
        name, _ = resolve_solver(solver, call)  # type: ignore[arg-type]
        if checkpoint is not None and checkpoint != "auto":
            checkpoint = frozenset(_policy_classes(checkpoint))
        try:  # a number is not iterable (TypeError); a string iterates into non-budgets (ValueError)
            remat = tuple(_check_budget(b, call) for b in remat_budgets)
        except (TypeError, ValueError):
            raise ValueError(f"`{call}(remat_budgets={remat_budgets!r})` must be a sequence of budgets in [0, 1] "
                             "(empty for none).") from None
        cands = tuple(candidate_budgets)
        if not cands:
            raise ValueError(f"`{call}(candidate_budgets={candidate_budgets!r})` is empty. Expected budgets in [0, 1].")
        return cls(
            budget=budget, max_memory=max_bytes, solver=solver,
            solver_name=solver if isinstance(solver, str) else f"custom:{name}",
            checkpoint=checkpoint, backend=_check_inner(backend, call, "backend"),
            candidate_budgets=tuple(_check_budget(b, call) for b in cands),
            search_backend=_check_inner(search_backend, call, "search_backend"),
            remat_budgets=remat,
        )


def plan_solver(settings: PlanSettings, plan: MemPlan) -> str | Callable[..., Any]:
    """The solver to compile ``plan`` with: the plan's own when it names one (a search may choose a
    ``"remat"`` plan; a loaded plan keeps its solver), else the user's callable from ``settings``."""
    from lightning_memplan.forecasting.backend import SOLVER_NAMES

    return plan.solver if plan.solver in SOLVER_NAMES else settings.solver


def sum_outputs(out: Any) -> torch.Tensor:
    """Default loss for forecasting: the sum of every floating tensor in the output."""
    leaves = [t for t in _compat.tree_leaves(out)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise ValueError("the module's forward returned no floating-point tensor to differentiate")
    total = leaves[0].float().sum()
    for t in leaves[1:]:
        total = total + t.float().sum()
    return total


class BoundForward(nn.Module):
    """``module``'s original forward as a module of its own, with fixed keyword arguments, so a
    forecast can compile it without going through any planned or wrapped forward."""

    def __init__(self, module: nn.Module, forward: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self._forward = forward
        self._kwargs = kwargs

    def forward(self, *args: Any) -> Any:
        return self._forward(*args, **self._kwargs)


def grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients of ``module``'s trainable parameters between steps (unique
    parameters; of a sharded parameter, a DTensor, this rank's shard; of an FSDP2 parameter, its
    padded shard, also inside a unit's forward where the module holds the unsharded one)."""
    from lightning_memplan._torch.compat import fsdp2_shard_bytes, local_tensor

    shards = fsdp2_shard_bytes(module)
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            t = local_tensor(p)
            total += shards.get(id(p), t.numel() * t.element_size())
    return total


def gradless_parameters(module: nn.Module, reached: Collection[int]) -> list[nn.Parameter]:
    """``module``'s trainable parameters (each once) whose ``id`` is not in ``reached``
    (:func:`~lightning_memplan.forecasting.eager_loss.parameters_reached` of a step's loss): the step gives
    them no gradient."""
    unique = {id(p): p for p in module.parameters() if p.requires_grad and id(p) not in reached}
    return list(unique.values())


def gradless_bytes(module: nn.Module, reached: Collection[int]) -> int:
    """Bytes of the gradients :func:`grad_bytes` counts for :func:`gradless_parameters`: none."""
    from lightning_memplan._torch.compat import local_tensor

    return sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in gradless_parameters(module, reached))


def other_optimizer_state_bytes(optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """Bytes of the steady-state state of every optimizer but the first (existing, or simulated on
    meta tensors: :func:`~lightning_memplan.forecasting.optim_memory.optimizer_memory`)."""
    from lightning_memplan.forecasting.optim_memory import optimizer_memory

    return sum(optimizer_memory(o).state_bytes for o in optimizers[1:])


def step_grad_bytes(module: nn.Module, loop: TrainingLoop) -> int:
    """Bytes of the gradients ``module``'s parameters hold between steps of ``loop``:
    :func:`grad_bytes` less the parameters the step gives none (``loop.gradless_bytes``)."""
    return max(grad_bytes(module) - loop.gradless_bytes, 0)


@dataclass(frozen=True)
class TrainingLoop:
    """How Lightning runs the training step around the compiled forward: what decides which
    gradients are live when (see :func:`lightning_step_peak`)."""

    accumulate_grad_batches: int = 1
    """The Trainer's argument: micro-batches per optimizer step (>= 1)."""
    automatic_optimization: bool = True
    """The LightningModule's flag; ``False``: ``training_step`` calls ``zero_grad``, ``manual_backward``
    and ``step`` itself, in an order the plan cannot see."""
    resident_bytes: int = 0
    """Bytes of the LightningModule's parameters and buffers outside the planned submodule (a head
    ``training_step`` runs eagerly): live through every step, in the baseline, not in the forecast
    of the planned module. 0 when the whole LightningModule is planned."""
    param_bytes: int | None = None
    """Bytes of the planned module's parameters between steps when they differ from what its
    forecast counted (FSDP2: each parameter's padded shard, while the forecast, run inside the
    root's forward, saw the root's own parameters unsharded); ``None``: as the forecast counted."""
    gradless_bytes: int = 0
    """Bytes of the planned module's trainable parameters that the step gives no gradient (no path
    from the loss reaches them: a head only validation uses), so they hold none between steps
    (:func:`gradless_bytes`, from the first batch's loss); 0 until that is known."""
    other_optimizer_state_bytes: int = 0
    """Bytes of the state of the optimizers after the first (manual optimization with several, as a
    GAN's discriminator's): live through every step, in the baseline; the forecast counts the
    first optimizer's (:func:`other_optimizer_state_bytes`)."""

    def __post_init__(self) -> None:
        n = self.accumulate_grad_batches
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`accumulate_grad_batches={n!r}` must be an int >= 1 (Lightning's Trainer argument).")
        for name, v in (("resident_bytes", self.resident_bytes), ("param_bytes", self.param_bytes),
                        ("gradless_bytes", self.gradless_bytes),
                        ("other_optimizer_state_bytes", self.other_optimizer_state_bytes)):
            if v is None and name == "param_bytes":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"`{name}={v!r}` must be an int >= 0.")

    @classmethod
    def of(cls, trainer: Any, module: Any, planned: nn.Module | None = None) -> TrainingLoop:
        """The loop ``trainer`` runs for ``module`` (defaults for what either lacks), whose submodule
        ``planned`` is the one planned (default: ``module`` itself)."""
        from lightning_memplan._torch.compat import (
            fsdp2_shard_bytes,
            local_tensor,
            storage_key,
        )

        n = getattr(trainer, "accumulate_grad_batches", 1)
        resident, params = 0, None
        if isinstance(module, nn.Module):
            shards = fsdp2_shard_bytes(module)
            planned = planned if planned is not None else module
            mine = {id(p): p for p in planned.parameters()}
            if shards:
                params = sum(shards.get(k, local_tensor(p).numel() * local_tensor(p).element_size())
                             for k, p in mine.items())
            if planned is not module:
                seen = {storage_key(local_tensor(t)) for t in (*mine.values(), *planned.buffers())}
                for t in (*module.parameters(), *module.buffers()):
                    key = storage_key(local_tensor(t))
                    if key not in seen:
                        seen.add(key)
                        resident += shards.get(id(t), int(local_tensor(t).untyped_storage().nbytes()))
        return cls(accumulate_grad_batches=n if isinstance(n, int) and n >= 1 else 1,
                   automatic_optimization=bool(getattr(module, "automatic_optimization", True)),
                   resident_bytes=int(resident), param_bytes=params)


def check_submodule(path: str | None, call: str) -> str | None:
    """``path`` if it is None or an attribute path (``"model"``, ``"model.backbone"``), else a ValueError."""
    if path is not None and (not isinstance(path, str) or not all(p.isidentifier() for p in path.split("."))):
        raise ValueError(f"`{call}(submodule={path!r})` must be None or an attribute path of the "
                         "LightningModule such as 'model' or 'model.backbone'.")
    return path


def resolve_submodule(module: nn.Module, path: str | None, call: str) -> nn.Module:
    """``module`` itself (``path`` None) or its submodule at ``path``; a ValueError naming the
    argument and ``module``'s children when there is none."""
    if path is None:
        return module
    try:
        return module.get_submodule(path)
    except AttributeError:
        children = [name for name, _ in module.named_children()]
        raise ValueError(f"`{call}(submodule={path!r})`: {type(module).__name__} has no submodule {path!r}; "
                         f"its children are {children}.") from None


def uncompiled_warnings(module: nn.Module, fc: Any) -> list[str]:
    """What of ``module``'s forward ran uncompiled, so that the plan does not reach it and ``fc``
    (its forecast) misses its activations: one message per cause, ``[]`` when nothing is known.

    - No compiled graph reads a trainable parameter (``Forecast.compiled_parameter_bytes`` 0): dynamo
      ran the whole forward eagerly.
    - ``nn.LSTM``/``GRU``/``RNN`` modules while ``torch._dynamo.config.allow_rnn`` is False: dynamo
      runs them eagerly (a 2-layer LSTM language model was forecast 17% low; with ``allow_rnn`` its
      layers are compiled and planned, and the forecast was within 0.1%).
    """
    out: list[str] = []
    trainable = any(p.requires_grad for p in module.parameters())
    if fc is not None and trainable and fc.compiled_parameter_bytes == 0:
        out.append(
            "dynamo compiled none of the forward's own computation (no compiled graph reads a trainable "
            "parameter): it ran it eagerly, so the plan changes nothing and the forecast misses the activations. "
            "A graph break inside a loop makes dynamo skip the whole frame, and of the modules that frame calls "
            "it compiles those of your own classes only, not torch's (wrap an nn.TransformerEncoderLayer in a "
            "module of your own, or shard it with FSDP2's fully_shard: each FSDP2 unit is compiled on its own). "
            "Run with TORCH_LOGS=graph_breaks to see where.")
    rnns = [name for name, m in module.named_modules()
            if isinstance(m, nn.RNNBase) and any(p.requires_grad for p in m.parameters())]
    if rnns and not _compat.dynamo_allows_rnn():
        shown = ", ".join(repr(n) for n in rnns[:3]) + (f" and {len(rnns) - 3} more" if len(rnns) > 3 else "")
        out.append(
            f"the recurrent modules {shown} run eagerly: dynamo does not compile nn.LSTM, nn.GRU or nn.RNN "
            "unless `torch._dynamo.config.allow_rnn = True`, so the plan does not reach them and the forecast "
            "misses their activations (the measured peak will be higher). Set `torch._dynamo.config.allow_rnn "
            "= True` before fitting to compile and plan them (torch marks it experimental: where the compile "
            "fails, training goes on uncompiled, with a warning).")
    return out


def eager_forward_warning(module: nn.Module, ids: Collection[int]) -> str | None:
    """A message naming the modules of ``module`` whose trainable parameters (``ids``) the forward
    read outside every compiled graph (their layers ran eagerly inside it: a function dynamo is
    told not to trace, code in a frame it skipped), with their bytes; ``None`` when there are none.
    Their activations are neither planned nor forecast."""
    owners: dict[str, int] = {}
    for name, p in module.named_parameters():
        if id(p) in ids:
            owner = name.rsplit(".", 1)[0] if "." in name else "(the module itself)"
            owners[owner] = owners.get(owner, 0) + p.numel() * p.element_size()
    if not owners:
        return None
    shown = ", ".join(repr(n) for n in list(owners)[:4]) + (f" and {len(owners) - 4} more" if len(owners) > 4 else "")
    return (f"the forward ran the layers of {shown} ({sum(owners.values()):,} bytes of trainable parameters) outside "
            "every compiled graph (a function dynamo does not trace, or code in a frame it skipped), so the plan "
            "does not reach them and the forecast misses their activations: the measured peak can be higher than "
            "predicted. TORCH_LOGS=graph_breaks shows why.")


def live_grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients ``module``'s parameters hold right now (unique storages)."""

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return sum(n for n, _ in _compat.unique_storages(grads, set()))


def lightning_step_peak(fc: Any, grads: int, loop: TrainingLoop = TrainingLoop()) -> int:
    """The forecast peak of a Lightning training step, above its baseline (:func:`lightning_step_memory`).

    ``forecast()`` models a step that starts without gradients. Lightning's automatic optimization
    keeps the previous step's gradients until ``zero_grad`` (``set_to_none``), which it calls after
    ``training_step`` and before ``backward``: during the forward they are still live (they belong
    to the starting bytes), and from the backward on they are gone while the new ones are created.
    So the forward part of the forecast timeline stands as it is, and the rest is ``grads`` lower.

    With gradient accumulation (``accumulate_grad_batches`` N > 1) the highest of the N micro-batches
    is the last: ``zero_grad`` runs only in the first, so the backward creates its gradients on top
    of the accumulated ones (``AccumulateGrad`` adds them in place and frees them), and the optimizer
    steps with only the accumulated ones live: the forward and backward stand as forecast, the
    optimizer step is ``grads`` lower (:func:`lightning_step_timeline`).

    With manual optimization the step is ``forecast()``'s own, above a baseline without gradients:
    ``zero_grad`` either ends the step (the next starts without gradients) or opens it, before the
    forward (the gradients live at the start are freed before anything else is allocated); either
    way the bytes above the gradient-free baseline are the forecast's.

    On CUDA (``fc.cuda_allocator`` set) the peak is the caching allocator's, in blocks as
    ``torch.cuda.max_memory_allocated`` counts them: the forecast's allocations in Lightning's order
    (:func:`~lightning_memplan.forecasting.allocations.lightning_order`, or
    :func:`~lightning_memplan.forecasting.allocations.accumulation_order`) replayed through its model.
    """
    if not loop.automatic_optimization:
        return int(fc.peak_bytes)
    if fc.cuda_allocator is not None and fc.allocations is not None:
        from lightning_memplan.forecasting.allocations import (
            accumulation_order,
            lightning_order,
            simulate_cuda_allocator,
        )

        order = lightning_order if loop.accumulate_grad_batches == 1 else accumulation_order
        return simulate_cuda_allocator(order(fc.allocations), device=fc.cuda_allocator.device).allocated_peak_bytes
    return max([0, *(b for _, b in lightning_step_timeline(fc, grads, loop))])


def lightning_step_memory(fc: Any, grads: int, loop: TrainingLoop = TrainingLoop()) -> tuple[int, int | None]:
    """``(baseline bytes, peak bytes above it)`` of a Lightning training step from its forecast. The
    baseline holds the gradients (``grads`` bytes) under automatic optimization, where they are live
    when a step starts; the peak is ``None`` when the forecast failed."""
    base = (fc.baseline_bytes + loop.resident_bytes + loop.other_optimizer_state_bytes
            + (grads if loop.automatic_optimization else 0))
    if loop.param_bytes is not None and fc.breakdown is not None:
        base += loop.param_bytes - fc.breakdown.parameters
    return base, None if fc.peak_bytes is None else lightning_step_peak(fc, grads, loop)


def lightning_step_timeline(fc: Any, grads: int, loop: TrainingLoop = TrainingLoop()) -> list[tuple[str, int]]:
    """``(phase, bytes above the step's baseline)`` of a Lightning training step, for every step of
    the forecast schedule (see :func:`lightning_step_peak`); with ``accumulate_grad_batches`` > 1, of
    the micro-batch that steps the optimizer."""
    if not loop.automatic_optimization:
        shifted: tuple[str, ...] = ()
    elif loop.accumulate_grad_batches > 1:
        shifted = ("optimizer",)
    else:
        shifted = ("backward", "optimizer")
    return [(s.phase, s.bytes - grads if s.phase in shifted else s.bytes) for s in fc.timeline]


def decide_plan(
    settings: PlanSettings,
    module: nn.Module,
    forward: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    *,
    call: str,
    loop: TrainingLoop = TrainingLoop(),
    kept: list[Any] | None = None,
) -> MemPlan:
    """A fixed-budget plan, or the search's choice (knee, or cheapest within ``max_memory``).

    Candidates are judged by the memory of the Lightning training step ``loop`` runs
    (:func:`lightning_step_memory`).
    When nothing fits ``max_memory``, warns (:class:`PlanWarning`) and returns the plan with the
    smallest forecast. ``kept``: a list that receives the candidates' forecasts when a search ran
    (aligned with ``plan.candidates``; plain data), for :func:`rejudge_plan`.
    """
    if not isinstance(settings.budget, str):
        return MemPlan(budget=float(settings.budget), solver=settings.solver_name,
                       backend=settings.backend, reason="budget given")
    sets = checkpoint_candidates(resolve_blocks(module, settings.checkpoint))
    target = BoundForward(module, forward, kwargs)
    grads = step_grad_bytes(module, loop)
    try:
        result = search(target, tuple(args), budgets=settings.candidate_budgets,
                        checkpoint_sets=[tuple(f"module.{b}" for b in s) for s in sets],
                        solver=settings.solver, backend=settings.search_backend, optimizer=optimizer,
                        loss_fn=sum_outputs, max_memory=settings.max_memory,
                        remat_budgets=settings.remat_budgets,
                        step_memory=lambda fc: lightning_step_memory(fc, grads, loop),
                        keep_forecasts=kept is not None)
        plan, forecasts = result.plan, result.forecasts
    except PlanDoesNotFit as exc:
        warnings.warn(f"{call}: {exc} Training with the smallest plan.", PlanWarning, stacklevel=2)
        plan, forecasts = exc.plan, exc.forecasts
    if kept is not None:
        kept.extend(forecasts)
    return _relative_to_module(plan, settings)


def _relative_to_module(plan: MemPlan, settings: PlanSettings) -> MemPlan:
    """The search named blocks relative to :class:`BoundForward`: the plan names them relative to
    the module."""
    strip = lambda names: tuple(n.removeprefix("module.") for n in names)  # noqa: E731
    cands = tuple(dataclasses.replace(c, checkpoint=strip(c.checkpoint)) for c in plan.candidates)
    return dataclasses.replace(plan, checkpoint=strip(plan.checkpoint), candidates=cands,
                               backend=settings.backend)


def rejudge_plan(
    settings: PlanSettings,
    plan: MemPlan,
    forecasts: Sequence[Any],
    grads: int,
    *,
    calls: int,
    new_input_bytes: int | Sequence[int] = 0,
    eager_loss: EagerLoss | Sequence[EagerLoss] | None = None,
    made_input_bytes: int = 0,
    loop: TrainingLoop = TrainingLoop(),
    optimizer: OptimizerMemory | None = None,
) -> MemPlan:
    """``plan``'s candidates judged again for a training step that calls the model ``calls`` times
    (``Forecast.repeated``; ``new_input_bytes`` as it takes them) with the measured ``eager_loss``
    (one per call) laid in (``Forecast.with_eager_loss``) and the first call's inputs the step made
    (``Forecast.with_inputs_made_in_step``), and chosen again, as
    :func:`decide_plan` chooses; nothing is compiled. ``grads``: gradient bytes live when a step
    starts (see :func:`lightning_step_memory`); ``optimizer``: the optimizer's memory, when it
    differs from the forecasts' (``Forecast.with_optimizer_memory``). When nothing fits
    ``max_memory``, the smallest plan (as :func:`decide_plan`, without a warning: the caller reports it).

    Raises:
        ValueError: ``forecasts`` does not match ``plan.candidates``.
    """
    losses, eager_grads = _as_laid_in((eager_loss,) if isinstance(eager_loss, EagerLoss) else tuple(eager_loss or ()),
                                      loop)

    def judge(fc: Any) -> tuple[int, int | None]:
        if optimizer is not None:
            fc = fc.with_optimizer_memory(optimizer)
        return lightning_step_memory(_step_forecast(fc, calls=calls, new_input_bytes=new_input_bytes,
                                                    eager_losses=losses, made_input_bytes=made_input_bytes),
                                     grads + eager_grads, loop)

    try:
        new = rejudge(plan, forecasts, judge, max_memory=settings.max_memory, solver=settings.solver)
    except PlanDoesNotFit as exc:
        new = exc.plan
    how = "judged " + ", ".join(
        ([f"on {calls} forward calls per step"] if calls > 1 or not (eager_loss or made_input_bytes) else [])
        + (["with the inputs training_step makes"] if made_input_bytes else [])
        + (["with the loss on the outputs measured on the first batch"] if eager_loss else []))
    return dataclasses.replace(new, backend=settings.backend, reason=f"{new.reason}, {how}")


def input_storages(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[int, int]:
    """``{storage key: bytes}`` of the tensors among a call's arguments (no reference kept)."""
    from lightning_memplan._torch.compat import storage_key, tree_leaves

    leaves = [t for t in tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor)]
    return {storage_key(t): int(t.untyped_storage().nbytes()) for t in leaves}


def call_signature(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``(shape, dtype, device type)`` of each tensor among a call's arguments, in order: calls
    that differ in it run graphs of their own (the callback compiles with ``dynamic=False``)."""
    from lightning_memplan._torch.compat import tree_leaves

    return tuple((tuple(t.shape), t.dtype, t.device.type)
                 for t in tree_leaves((tuple(args), kwargs)) if isinstance(t, torch.Tensor))


def fresh_input_bytes(call_inputs: Sequence[dict[int, int]], calls: int,
                      before: Collection[int] = ()) -> list[int] | int:
    """Bytes of the inputs each call after the first got that no earlier call had (another view
    of the batch), from :func:`input_storages` of each call; storages in ``before`` (live before
    the step: the batch, parameters) are not fresh. 0 when they were not recorded for every call."""
    seen: dict[int, int] = dict.fromkeys(before, 0)
    fresh = []
    for i, storages in enumerate(call_inputs[:calls]):
        if i:
            fresh.append(sum(n for k, n in storages.items() if k not in seen))
        seen.update(storages)
    return fresh if len(fresh) == calls - 1 else 0


def made_input_bytes(call_inputs: Sequence[dict[int, int]], before: Collection[int]) -> int:
    """Bytes of the first call's inputs (:func:`input_storages`) that were not live before the
    step (storage keys ``before``: the batch, parameters, buffers): ``training_step`` made them
    (``x.float() / 255``). 0 when no call was recorded."""
    return sum(n for k, n in call_inputs[0].items() if k not in before) if call_inputs else 0


def storage_keys(*trees: Any) -> set[int]:
    """Storage keys of every tensor in ``trees`` (any nesting; modules give their parameters
    and buffers)."""
    from lightning_memplan._torch.compat import storage_key, tree_leaves

    keys: set[int] = set()
    for tree in trees:
        tensors = [*tree.parameters(), *tree.buffers()] if isinstance(tree, nn.Module) else tree_leaves(tree)
        keys.update(storage_key(t) for t in tensors if isinstance(t, torch.Tensor))
    return keys


def _as_laid_in(losses: Sequence[EagerLoss], loop: TrainingLoop) -> tuple[tuple[EagerLoss, ...], int]:
    """The eager losses as a Lightning step ``loop`` lays them in, and the bytes of the gradients of
    the parameters only their eager code reads (``EagerLoss.param_grad_bytes``). Under automatic
    optimization those gradients are live when a step starts, like the planned module's, and
    ``zero_grad`` frees them before the backward makes them again (:func:`lightning_step_memory`
    takes them with the others). With ``accumulate_grad_batches`` > 1, ``AccumulateGrad`` sums the
    new ones into them in place: a transient, not laid in."""
    grads = sum(m.param_grad_bytes for m in losses)
    if loop.automatic_optimization and loop.accumulate_grad_batches > 1:
        losses = [dataclasses.replace(m, param_grad_bytes=0) for m in losses]
    return tuple(losses), grads


def _step_forecast(fc: Any, *, calls: int, new_input_bytes: int | Sequence[int], eager_losses: Sequence[EagerLoss],
                   made_input_bytes: int) -> Any:
    """``fc`` laid out with the first call's inputs the step made, for ``calls`` calls, with the
    eager losses (one per call) laid in; nothing is compiled."""
    if made_input_bytes:
        fc = fc.with_inputs_made_in_step(made_input_bytes)
    if calls > 1 and fc.calls != calls:  # (laid out already for calls of other shapes: with_calls)
        fc = fc.repeated(calls, new_input_bytes=new_input_bytes)
    return fc.with_eager_loss(tuple(eager_losses)) if eager_losses else fc


def lay_out_step(plan: MemPlan, fc: Any, *, calls: int, new_input_bytes: int | Sequence[int] = 0,
                 eager_losses: Sequence[EagerLoss] = (), made_input_bytes: int = 0,
                 loop: TrainingLoop = TrainingLoop(), grads: int | None = None,
                 optimizer: OptimizerMemory | None = None) -> tuple[MemPlan, Any]:
    """``plan`` and its forecast ``fc`` laid out for the step the first batch showed (nothing is
    compiled): ``calls`` calls of the forward per step (``Forecast.repeated``, ``new_input_bytes``
    as it takes them), the eager code between the forward and the backward (``eager_losses``,
    one per call; ``Forecast.with_eager_loss``) and the first call's inputs the step made
    (``made_input_bytes``; ``Forecast.with_inputs_made_in_step``). The plan's prediction, baseline
    and activations are those of the Lightning step ``loop`` runs (:func:`lightning_step_memory`),
    with ``grads`` bytes of the planned module's gradients between steps (:func:`step_grad_bytes`;
    default: the plan's breakdown) and ``optimizer``'s prediction of the optimizer's memory
    (``Forecast.with_optimizer_memory``; default: the forecast's). Returns them unchanged when there
    is nothing to lay out or no forecast. Raises what the layout raises."""
    module_grads = plan.breakdown.get("gradients", 0) if grads is None else grads
    nothing = (calls <= 1 and not eager_losses and not made_input_bytes and optimizer is None
               and module_grads == plan.breakdown.get("gradients", 0))
    if nothing or fc is None or fc.peak_bytes is None:
        return plan, fc
    losses, eager_grads = _as_laid_in(eager_losses, loop)
    if optimizer is not None:
        fc = fc.with_optimizer_memory(optimizer)
    fc = _step_forecast(fc, calls=calls, new_input_bytes=new_input_bytes, eager_losses=losses,
                        made_input_bytes=made_input_bytes)
    grads = module_grads + eager_grads
    baseline, peak = lightning_step_memory(fc, grads, loop)
    breakdown = dict(plan.breakdown)
    if fc.breakdown:
        breakdown.update(activations=fc.breakdown.activations, inputs=fc.breakdown.inputs, gradients=grads,
                         optimizer_state=fc.breakdown.optimizer_state + loop.other_optimizer_state_bytes,
                         optimizer_temporaries=fc.breakdown.optimizer_temporaries)
        if "fsdp_buffers" in breakdown:  # those live at the new peak
            breakdown["fsdp_buffers"] = fc.breakdown.fsdp_buffers
    return dataclasses.replace(plan, predicted_peak_bytes=peak, baseline_bytes=baseline, breakdown=breakdown), fc


def other_call_forecasts(settings: PlanSettings, plan: MemPlan, module: nn.Module, forward: Callable[..., Any],
                         optimizer: torch.optim.Optimizer | None, loop: TrainingLoop, first: Any,
                         signatures: Sequence[tuple[Any, ...]],
                         others: Mapping[tuple[Any, ...], tuple[Sequence[Any], dict[str, Any]]]) -> list[Any]:
    """One forecast per call of a step after the first, for ``Forecast.with_calls``: ``first`` (the
    first call's forecast) for a call of its shapes (``signatures``: :func:`call_signature` of
    every call, in order), else ``plan`` forecast (:func:`forecast_plan`; its blocks must already be
    wrapped) on the arguments ``others`` holds for that call's signature: dynamo compiles graphs of
    their own for them. Raises when one fails."""
    by_signature: dict[tuple[Any, ...], Any] = {}
    for signature, (args, kwargs) in others.items():
        _, fc = forecast_plan(settings, plan, module, forward, args, kwargs, optimizer, loop=loop)
        if fc.peak_bytes is None:
            raise RuntimeError("the forecast for a call of other input shapes failed: " + "; ".join(fc.problems))
        by_signature[signature] = fc
    return [first if sig == signatures[0] else by_signature[sig] for sig in signatures[1:]]


def forecast_plan(
    settings: PlanSettings,
    plan: MemPlan,
    module: nn.Module,
    forward: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    *,
    loop: TrainingLoop = TrainingLoop(),
) -> tuple[MemPlan, Any]:
    """Forecast ``plan`` on ``settings.backend`` (the plan's blocks must already be wrapped) and
    return the plan with the prediction for the Lightning step ``loop`` runs
    (:func:`lightning_step_memory`), breakdown and partitioner notes filled in, and the
    :class:`~lightning_memplan.forecasting.step_forecast.Forecast`. Raises what the forecast raises."""
    from lightning_memplan.forecasting.step_forecast import forecast

    fc = forecast(BoundForward(module, forward, kwargs), tuple(args), budget=plan.budget,
                  solver=plan_solver(settings, plan), backend=settings.backend, loss_fn=sum_outputs,
                  optimizer=optimizer)
    if fc.peak_bytes is None:
        return plan, fc
    grads = step_grad_bytes(module, loop)
    breakdown: dict[str, int] = {}
    if fc.breakdown is not None:
        b = fc.breakdown
        params = b.parameters if loop.param_bytes is None else loop.param_bytes
        breakdown = {"activations": b.activations, "parameters": params + b.buffers + loop.resident_bytes,
                     "gradients": grads, "optimizer_state": b.optimizer_state + loop.other_optimizer_state_bytes,
                     "inputs": b.inputs,
                     "optimizer_temporaries": b.optimizer_temporaries}
        if b.fsdp_buffers:
            breakdown["fsdp_buffers"] = b.fsdp_buffers
    notes = tuple(
        f"region {r.index}: " + ("solver called" if r.decision and r.decision.solver_called
                                 else f"solver not called ({r.decision.reason if r.decision else 'unknown'})")
        for r in fc.regions)
    baseline, peak = lightning_step_memory(fc, grads, loop)
    plan = dataclasses.replace(plan, predicted_peak_bytes=peak, baseline_bytes=baseline, breakdown=breakdown,
                               notes=notes)
    return plan, fc
