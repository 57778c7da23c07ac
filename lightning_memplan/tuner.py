"""Plan before a long run, in the spirit of Lightning's ``Tuner.lr_find``: one batch, no training.

``plan = plan_memory(trainer, model, datamodule=dm)`` runs ``training_step`` once on the first
training batch (the forward without autograd, to see how many times the step calls it and to
measure the eager code after it: the loss on the outputs, metrics), forecasts the candidate plans on the real
compiled graphs of ``model`` with that batch, returns the chosen
:class:`~lightning_memplan.plan.MemPlan` (``plan.save("plan.json")``), and leaves the model, the
trainer and torch's settings as they were. ``MemPlanCallback(plan="plan.json")`` then trains with
it without searching again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device, rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from lightning_memplan._torch.storages import tree_leaves, tree_map
from lightning_memplan.core.instance_patch import instance_attributes
from lightning_memplan.forecasting.autograd_walk import parameters_reached
from lightning_memplan.forecasting.eager_loss import (
    EagerCalls,
    measure_eager_losses,
)
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.called_modules import CallWatch, ModuleCall
from lightning_memplan.planner.checkpointing import CheckpointPolicy
from lightning_memplan.planner.device_limit import device_limit
from lightning_memplan.planner.kv_cache import cache_off_patches
from lightning_memplan.core.batch_search import BatchSizeChoice
from lightning_memplan.planner.batch_size import max_batch_size
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.pipeline import PlannedStep, StepObservation, plan_step
from lightning_memplan.planner.precompiled import compiled_by_user
from lightning_memplan.planner.rng import rng_kept
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import (
    PlanSettings,
    check_submodule,
    resolve_submodule,
)
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    call_signature,
    fresh_input_bytes,
    input_storages,
    made_input_bytes,
    other_optimizer_state_bytes,
    storage_keys,
)

__all__ = ["plan_memory"]


class _Captured(Exception):
    """Raised by the capturing forward once it has the arguments of the first call."""


def _configured(configured: Any) -> tuple[list[torch.optim.Optimizer], int]:
    """The optimizers of whatever ``configure_optimizers`` returned, and how many LR schedulers."""
    if isinstance(configured, torch.optim.Optimizer):
        return [configured], 0
    if isinstance(configured, dict):
        opts, _ = _configured(configured.get("optimizer"))
        return opts, int(configured.get("lr_scheduler") is not None)
    if isinstance(configured, (list, tuple)) and len(configured) == 2 and all(
            isinstance(c, (list, tuple)) for c in configured):
        return _configured(configured[0])[0], len(configured[1])  # ([optimizers], [schedulers])
    if isinstance(configured, (list, tuple)):
        parts = [_configured(c) for c in configured]
        return [o for opts, _ in parts for o in opts], sum(n for _, n in parts)
    return [], 0


class _StandInOptimizer:
    """What ``self.optimizers()`` returns while plan_memory runs ``training_step`` (manual
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
    """The LightningModule methods that need a running ``fit``, as plan_memory runs ``training_step``
    once outside it: ``self.log`` does nothing, ``self.optimizers()`` and ``self.lr_schedulers()``
    return stand-ins that step nothing, ``self.manual_backward(loss)`` appends ``loss`` to
    ``losses`` and runs no backward, ``clip_gradients`` and ``(un)toggle_optimizer`` do nothing."""
    made: list[tuple[list[_StandInOptimizer], list[_StandInScheduler]]] = []

    def configured() -> tuple[list[_StandInOptimizer], list[_StandInScheduler]]:
        if not made:  # only when training_step asks (configure_optimizers may be costly)
            optimizers, n_schedulers = _configured(model.configure_optimizers())
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


def _forward_arguments(model: LightningModule, batch: Any, target: nn.Module | None = None,
                       call: str = "self(...)") -> tuple[tuple[Any, ...], dict[str, Any]]:
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
            f"plan_memory: `training_step` never called the module itself (`{call}`), so there is "
            "no forward to compile. Call it in training_step, or plan the submodule you run "
            "(`submodule=\"model\"` for `self.model(x)`)."
        )
    return captured["call"]


def _called_module(model: LightningModule, batch: Any) -> str | None:
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
        rank_zero_info(f"plan_memory: training_step calls `self.{found[0]}(...)`: planning {found[0]!r} "
                       "(pass `submodule=` to plan another module).")
    return found[0] if found else None


@dataclass(frozen=True)
class _ProbedStep:
    """What one run of ``training_step`` showed, for the plan (see :func:`_probe_step`)."""

    #: The arguments of the first call of the planned forward.
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: How the step called it; the forward ran without autograd, so the parameters reached are the
    #: eager code's (``eager_reached``) and the compiled graphs' (``Forecast.compiled_parameter_ids``).
    observed: StepObservation


def _probe_step(model: LightningModule, batch: Any, target: nn.Module, device: torch.device) -> _ProbedStep | None:
    """Run ``training_step`` once as ``fit`` would, but with the planned forward run without
    autograd and its floating-point outputs made leaves that require grad: the loss and whatever
    else runs on the outputs build their autograd graph as in training, and are measured as the
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

    def leaf(t: Any) -> Any:
        return t.detach().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    def probe(*args: Any, **kwargs: Any) -> Any:
        eager.close()
        if not first:
            first.append((args, kwargs))
        inputs.append(input_storages(args, kwargs))
        signatures.append(call_signature(args, kwargs))
        if signatures[-1] != signatures[0]:
            others.setdefault(signatures[-1], (args, kwargs))
        with torch.no_grad():
            out = tree_map(leaf, original(*args, **kwargs))
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
        # a leaf is held by its AccumulateGrad node, so every output looks alive here: only those
        # training_step returned stay alive in fit (the loss's saved ones are found by the walk)
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
        return _ProbedStep(args=first[0][0], kwargs=first[0][1], observed=observed)
    except Exception as exc:  # noqa: BLE001 - planned without it
        rank_zero_info(f"plan_memory: running training_step once to measure the loss on the outputs failed "
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


def plan_memory(
    trainer: Trainer,
    model: LightningModule,
    *,
    datamodule: LightningDataModule | None = None,
    train_dataloaders: Any = None,
    budget: float | str = "auto",
    max_memory: int | str | None = None,
    solver: str | Callable[..., Any] = "dp",
    checkpoint: CheckpointPolicy = "auto",
    backend: str = "auto",
    candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
    search_backend: str = "aot_eager",
    remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
    submodule: str | None = None,
    regional: bool | Literal["auto"] = "auto",
    search_time_limit: float | None = None,
    batch_size: Literal["max"] | None = None,
    batch_arg_name: str = "batch_size",
) -> MemPlan:
    """Choose a memory plan for ``model`` on the first training batch, without training.

    The plan arguments (``submodule``, ``regional`` and ``search_time_limit`` too) mean what they mean for
    :class:`~lightning_memplan.MemPlanCallback`. The
    batch comes from ``train_dataloaders``, else ``datamodule.train_dataloader()`` (after
    ``setup("fit")``), else ``model.train_dataloader()``: the first of any iterable of batches
    (for inputs of varying length, ``train_dataloaders=[longest_batch]`` plans the largest step,
    which the fit's ``MemPlanCallback(plan=plan)`` then forecasts alike); it is moved to
    ``trainer.strategy.root_device`` with the model. Afterwards the model is back on its device and
    in its mode, with its parameters, gradients and buffers as they were.

    A model that overrides ``configure_model`` (which makes or compiles layers there) gets it called
    first, as ``fit`` calls it (Lightning asks for it to be idempotent). A model the user compiled
    (``torch.compile(model)``, a compiled submodule) is planned as written (:mod:`lightning_memplan.planner.precompiled`).

    The step is planned as ``fit`` runs it: inside the Trainer's precision plugin's step context
    (autocast for ``"16-mixed"`` / ``"bf16-mixed"``) and with its ``accumulate_grad_batches``. The
    ``"-true"`` precisions convert the module's parameters only when ``fit`` starts; for those the
    plan is forecast in the module's current dtype (the callback forecasts it again in training).

    ``training_step`` runs once first, with the planned forward run without autograd (its
    floating-point outputs made leaves that require grad), ``self.log`` silenced and torchmetrics
    metrics put back afterwards: the calls of the forward per step and the eager code between the
    forward and the backward (the loss on the outputs, metrics; measured as the callback measures
    it on its first batch) are laid into every candidate's forecast. ``self.optimizers()`` and
    ``self.lr_schedulers()`` return stand-ins that step nothing, and under manual optimization the
    loss measured is the first ``manual_backward``'s (no backward runs). When that run fails (a step
    that needs the Trainer), the compiled forward is planned alone, as the callback then plans it
    until its first batch has run.

    ``batch_size="max"``: first the largest batch whose step has a plan within the limit (``max_memory``, else on
    CUDA the device's memory), found from forecasts at candidate sizes that allocate nothing
    (:mod:`lightning_memplan.planner.batch_size`), starting from the batch the dataloader makes now. The
    attribute ``batch_arg_name`` is set to it where ``BatchSizeFinder`` sets it (the model, its ``hparams``,
    the datamodule and its ``hparams``; it stays set, for the fit), the train dataloader is built again
    and the plan is chosen on its first batch; ``plan.batch_size`` and ``plan.batch_trials`` record the
    size and every trial (batch, plan, forecast total, extra compute, fits?). When no size fits, a
    warning says so and the plan is made at the batch size as it was.

    Raises:
        ValueError: a bad argument (before anything runs); with ``batch_size="max"``: no limit (the CPU
            without ``max_memory``), no attribute ``batch_arg_name``, ``train_dataloaders`` given (it
            cannot be built again at another size), or a dataloader that ignores the attribute.
        RuntimeError: ``training_step`` does not call ``self(...)``, or no candidate could be forecast.
    """
    settings = PlanSettings.from_args(
        "plan_memory", budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint,
        backend=backend, candidate_budgets=candidate_budgets, search_backend=search_backend,
        remat_budgets=remat_budgets, regional=regional, search_time_limit=search_time_limit)
    model = getattr(model, "_orig_mod", model) if not isinstance(model, LightningModule) else model  # torch.compile
    path = check_submodule(submodule, "plan_memory")
    attribute = _batch_attribute(model, datamodule, batch_size, batch_arg_name, train_dataloaders)
    if is_overridden("configure_model", model):  # it makes (or compiles) the model, as fit calls it
        model.configure_model()
    if datamodule is not None and train_dataloaders is None:
        datamodule.setup("fit")
    loader = _train_loader(model, datamodule, train_dataloaders)
    batch = next(iter(loader))
    device = trainer.strategy.root_device
    # backend="auto": inductor on CUDA, aot_eager elsewhere; budget="auto" without max_memory on CUDA: the
    # device's memory is the limit
    settings = settings.on_device(device).with_device_limit(device_limit(device, processes=trainer.world_size))
    if attribute is not None and settings.max_memory is None:
        raise ValueError(f"`plan_memory(batch_size='max')` needs a memory limit to fit: on {device.type} there is "
                         "no device limit to read (CUDA's memory is one). Give `max_memory=` (e.g. '8GiB').")
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    try:
        model.to(device)
        model.train()
        batch = move_data_to_device(batch, device)
        if path is None:  # training_step may call self.model(...) rather than self(...)
            with trainer.strategy.precision_plugin.train_step_context(), rng_kept():
                path = _called_module(model, batch)
        user = compiled_by_user(model, resolve_submodule(model, path, "plan_memory"))
    finally:
        model.to(home)
        model.train(was_training)
    target = user.module
    call = f"self.{path}(...)" if path else "self(...)"
    trials: tuple[dict[str, Any], ...] = ()
    if attribute is not None:
        choice = _largest_batch(trainer, model, batch, target, settings, attribute, loader, user.patches, device)
        trials = tuple(dataclasses.asdict(t) for t in choice.trials)
        if choice.batch_size is None:
            warnings.warn(f"plan_memory(batch_size='max'): no batch size fits: {choice.reason}; planning at "
                          f"{batch_arg_name}={attribute.get()} as it is.\n{choice.table()}", MemPlanWarning,
                          stacklevel=2)
        else:
            rank_zero_info(f"plan_memory: batch size {choice.batch_size} ({batch_arg_name}; was {attribute.get()}):\n"
                           f"{choice.table()}")
            attribute.set(choice.batch_size)
            batch = next(iter(_train_loader(model, datamodule, None)))
            attribute.check_batch(batch)
    planned = _plan_at(trainer, model, batch, target, settings, user.patches, device, call)
    if attribute is None:
        return planned.plan
    return dataclasses.replace(planned.plan, batch_size=attribute.get(), batch_trials=trials)


def _train_loader(model: LightningModule, datamodule: LightningDataModule | None, given: Any) -> Any:
    """The train dataloader: ``given``, else the datamodule's, else the model's (built now)."""
    if given is not None:
        return given
    return datamodule.train_dataloader() if datamodule is not None else model.train_dataloader()


@contextlib.contextmanager
def _in_step(trainer: Trainer, model: LightningModule, target: nn.Module, patches: Sequence[Any],
             device: torch.device) -> Any:
    """The model on ``device`` in training mode, its compile undone and key/value caches off, inside the
    precision plugin's step context with the generator kept: as ``fit`` runs a step. Yields
    ``(optimizer, loop)``; the model goes back to its device and mode afterwards."""
    param = next(model.parameters(), None)
    home = param.device if param is not None else torch.device("cpu")
    was_training = model.training
    # the user's torch.compile undone meanwhile: the plan compiles the forward (precompiled.py); the
    # key/value cache off, as the fit has it (planner.kv_cache)
    with instance_attributes([*patches, *cache_off_patches(target)]):
        try:
            model.to(device)
            model.train()
            optimizers = _configured(model.configure_optimizers())[0]
            loop = dataclasses.replace(TrainingLoop.of(trainer, model, target),
                                       other_optimizer_state_bytes=other_optimizer_state_bytes(optimizers))
            # in the precision plugin's step context (autocast for "16-mixed" / "bf16-mixed"), as fit runs it
            with trainer.strategy.precision_plugin.train_step_context(), rng_kept():
                yield (optimizers[0] if optimizers else None), loop
        finally:
            model.to(home)
            model.train(was_training)


def _plan_at(trainer: Trainer, model: LightningModule, batch: Any, target: nn.Module, settings: PlanSettings,
             patches: Sequence[Any], device: torch.device, call: str) -> PlannedStep:
    """The plan of ``model``'s step on ``batch``: ``training_step`` probed once, then decided, re-judged,
    forecast and laid out (:func:`~lightning_memplan.planner.pipeline.plan_step`)."""
    batch = move_data_to_device(batch, device)
    with _in_step(trainer, model, target, patches, device) as (optimizer, loop):
        forward = target.forward
        probed = _probe_step(model, batch, target, device)
        args, kwargs = (probed.args, probed.kwargs) if probed else _forward_arguments(model, batch, target, call)
        return plan_step(target, settings=settings, args=args, kwargs=kwargs, forward=forward,
                         optimizer=optimizer, call="plan_memory", loop=loop,
                         step=probed.observed if probed is not None else None)


def _largest_batch(trainer: Trainer, model: LightningModule, batch: Any, target: nn.Module, settings: PlanSettings,
                   attribute: _BatchAttribute, loader: Any, patches: Sequence[Any],
                   device: torch.device) -> BatchSizeChoice:
    """The largest batch size with a plan within ``settings.max_memory``, from forecasts at candidate
    sizes (:func:`~lightning_memplan.planner.batch_size.max_batch_size`), from ``batch`` at the size now."""
    assert settings.max_memory is not None
    size = attribute.get()
    batch = move_data_to_device(batch, device)
    attribute.check_batch(batch)
    dataset = getattr(loader, "dataset", None)
    try:
        most = len(dataset) if dataset is not None else None  # type: ignore[arg-type]
    except TypeError:  # an iterable dataset
        most = None
    with _in_step(trainer, model, target, patches, device) as (optimizer, loop):
        probed = _probe_step(model, batch, target, device)
        args, kwargs = (probed.args, probed.kwargs) if probed else _forward_arguments(model, batch, target)
        return max_batch_size(target, settings=settings, args=args, kwargs=kwargs, batch_size=size,
                              limit_bytes=settings.max_memory, limit_source=settings.limit_source,
                              device=device, forward=target.forward, optimizer=optimizer, loop=loop,
                              eager_losses=probed.observed.eager_losses if probed else (), max_size=most)


class _BatchAttribute:
    """The attribute ``name`` that sets the batch size, where ``BatchSizeFinder`` looks for it: the
    model, its ``hparams``, the datamodule and its ``hparams``. Read from the last that has it; set
    on every one."""

    def __init__(self, name: str, holders: list[Any]) -> None:
        self.name, self._holders = name, holders

    def get(self) -> int:
        holder = self._holders[-1]
        return int(holder[self.name] if isinstance(holder, dict) else getattr(holder, self.name))

    def set(self, value: int) -> None:
        for holder in self._holders:
            if isinstance(holder, dict):
                holder[self.name] = value
            else:
                setattr(holder, self.name, value)

    def check_batch(self, batch: Any) -> None:
        """A ValueError unless some tensor of ``batch`` has :meth:`get` rows: the dataloader follows the attribute."""
        size = self.get()
        rows = {t.shape[0] for t in tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim() > 0}
        if size not in rows:
            raise ValueError(f"`plan_memory(batch_size='max', batch_arg_name={self.name!r})`: the train dataloader "
                             f"made a batch of {sorted(rows)} rows with {self.name}={size}, so it does not build its "
                             f"batches from `{self.name}`. Pass it to the DataLoader: "
                             f"`DataLoader(..., batch_size=self.{self.name})`.")


def _batch_attribute(model: LightningModule, datamodule: LightningDataModule | None, batch_size: object,
                     name: object, given: Any) -> _BatchAttribute | None:
    """The batch attribute to search (``batch_size="max"``), or ``None``; a ValueError for bad arguments."""
    if batch_size is None:
        return None
    if batch_size != "max":
        raise ValueError(f"`plan_memory(batch_size={batch_size!r})` is not valid. Expected 'max' (the largest batch "
                         "that fits) or None (the batch size as it is).")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"`plan_memory(batch_arg_name={name!r})` must be the name of the attribute that sets the "
                         "batch size, such as 'batch_size'.")
    if given is not None:
        raise ValueError("`plan_memory(batch_size='max', train_dataloaders=...)`: a dataloader given as it is cannot "
                         "be built again at another batch size. Give the datamodule, or define train_dataloader() "
                         f"on the model, building it from `self.{name}`.")
    holders: list[Any] = []
    for owner in (model, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and name in hparams:
            holders.append(hparams)
    if not holders:
        searched = "the model, its hparams" + (", the datamodule and its hparams" if datamodule is not None else "")
        raise ValueError(f"`plan_memory(batch_size='max', batch_arg_name={name!r})`: no attribute {name!r} in "
                         f"{searched}. Store the batch size there (`self.{name} = 32`) and build the train "
                         "dataloader from it, or name the attribute with `batch_arg_name=`.")
    return _BatchAttribute(name, holders)
