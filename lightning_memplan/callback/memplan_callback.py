"""``MemPlanCallback``: ``Trainer(callbacks=[MemPlanCallback()])`` compiles the planned module
with a memory plan for the fit, can choose the plan on the first batch, and reports predicted vs
measured peak memory every epoch to the Trainer's loggers.

The class is configuration plus Lightning hooks of a few lines: each fit gets fresh parts, built
in ``setup`` (:mod:`.fit_parts`), which the hooks feed; the checkpoint state is
:mod:`.checkpoint_state`'s, and the reporter (:mod:`.reporter`) turns the results into metrics,
text and pictures.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_memplan.callback import reporter
from lightning_memplan.callback.batch_finder import find_batch_size
from lightning_memplan.callback.checkpoint_state import RestoredState, saved_state
from lightning_memplan.callback.compile_watch import CompileRecord
from lightning_memplan.callback.fit_parts import FitParts
from lightning_memplan.callback.options import callback_options
from lightning_memplan.callback.trainer_view import TrainerView
from lightning_memplan.core.batch_search import BatchSizeChoice
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import CheckpointPolicy
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import has_submodule, resolve_submodule

__all__ = ["MemPlanCallback", "MemPlanWarning"]


class MemPlanCallback(Callback):
    r"""Compile the LightningModule with a memory plan and report predicted vs measured peak memory.

    A plan is an activation memory budget (the ratio ``torch.compile``'s partitioner gives its
    knapsack solver) plus the set of blocks wrapped in activation checkpointing. On the first
    training batch the callback decides the plan (or takes the one given), compiles the module's
    ``forward`` with it for this fit only, and from then on measures the peak memory of training
    steps. Every torch setting it touches is scoped to the compile and restored; the module's
    ``forward`` is restored at teardown, also after an exception. If planning or compiling fails,
    training goes on with the module as the user wrote it, and a :class:`MemPlanWarning` says why.

    Args:
        budget: a float in [0, 1]; ``"auto"``: forecast candidate plans on the first batch and take
            the fastest plan whose forecast fits the limit: ``max_memory``, else on CUDA the device's
            memory (free plus what this process holds, less a margin for memory taken outside the
            caching allocator: :mod:`lightning_memplan.planner.device_limit`; judged by the forecast
            of what the allocator reserves), so no recompute at all when the unplanned step fits;
            on the CPU, which has no such limit, the knee of the forecast Pareto front (peak memory
            vs FLOPs); ``"knee"``: the knee on any device (with ``max_memory``, the fastest plan that
            fits it). The plan's ``reason`` says which, and the limit and where it came from.
        max_memory: a byte target (int, or a string such as ``"20GiB"`` or ``"512MB"``) for the
            bytes live during a step: parameters, their gradients (automatic optimization keeps them
            between steps), optimizer state and batch, plus the step's peak.
            With ``budget="auto"`` it selects the plan; with any budget, if the measured peak of the
            first steps exceeds it, the callback re-plans once with a smaller forecast (recompiling)
            when ``replan`` is on. With ``"auto"`` in one process, a batch of new input shapes whose
            forecast exceeds it (``forecast_new_shapes``) is that one re-plan: after the first such
            batch, the search runs again at those shapes.
        solver: ``"dp"`` (default), ``"hirschberg"``, ``"greedy"``, ``"ilp"``, or a callable with
            torch's solver signature ``(memory, runtimes, max_memory) -> (value, saved, recomputed)``:
            the knapsack over torch's recompute candidates; or ``"remat"``: whole-graph
            rematerialization, an exact MILP over every forward value (``budget`` then caps the
            saved bytes; see :mod:`lightning_memplan.core.remat`). With ``budget="auto"`` the search
            tries remat plans next to the knapsack's (``remat_budgets``), and the plan keeps the
            solver it was chosen with.
        checkpoint: blocks the search may wrap in activation checkpointing: ``"auto"`` (the model's
            repeated blocks), a set of module classes, or ``None``. Only used with ``budget="auto"``.
        backend: the backend the plan is compiled with. ``"auto"`` (default): ``"inductor"`` when the
            Trainer runs on CUDA, ``"aot_eager"`` on CPU and other devices (the same partitioner, so the
            same plan and activation memory, with eager kernels: inductor builds C++ for every graph
            on a CPU, over a minute for a small model), said at fit start; ``"inductor"`` or
            ``"aot_eager"`` to choose.
        candidate_budgets: budgets the search tries with each checkpoint set.
        regional: compile the model's repeated blocks (a transformer's layers) each on its own, as
            PyTorch's regional compilation does: layers alike share one compiled graph, so the
            compile and the plan search cost about the same at any depth (layers that read a
            constant of their own, such as a KV cache's layer index, compile a graph each), and
            each budget is applied to that one layer's graph (and to the stem's and head's graphs).
            The modules the frame looping over the blocks calls besides them (embeddings, a final
            norm) are compiled on their own too: dynamo runs that frame eagerly. ``False``: one
            compile of the whole module. ``"auto"`` (default): each on its own when the plan is
            searched (``budget="auto"``) and the model has repeated blocks, so the search costs
            about the same at any depth; a given budget compiles the module whole (torch's ratio of
            its one graph). The plan records them (``plan.regional``).
        remat_budgets: budgets of the whole-graph rematerialization plans (solver ``"remat"``) the
            search tries besides; ``()`` for none.
        search_time_limit: seconds the ``"auto"`` search may take (``None``, default: no limit).
            Once they have passed, no further trace or compile starts; the plan is chosen among the
            candidates forecast by then (at least one: a search always plans), with a warning that
            says how many were left out (their note in ``plan.candidates``). A trace running at the
            limit finishes, so the search can overrun it by one trace.
        search_backend: backend the candidates are forecast with (``"aot_eager"``: no code
            generation); the chosen plan is forecast again on ``backend``.
        plan: a :class:`~lightning_memplan.plan.MemPlan` or the path of one saved as JSON (from the
            tuner): use it without searching.
        replan: allow the closed-loop correction described under ``max_memory``.
        measure_batches: training batches measured per epoch (the first batch of the fit, which
            compiles, is never measured). On CPU each measured batch runs under the profiler, and
            so does one warm-up batch before them (see :meth:`on_train_batch_start`).
        log_plots: write the Pareto-front and memory-timeline PNGs into the logger's directory (and
            as TensorBoard figures, MLflow run artifacts under ``memplan/``, or W&B images under
            the keys ``memplan/frontier`` and ``memplan/timeline``, when those loggers are used);
            none under ``Trainer(fast_dev_run=...)``, which writes no files.
        compile_kwargs: extra keyword arguments for ``torch.compile``. The callback compiles with
            ``dynamic=False`` unless they set ``dynamic``: a smaller last batch then gets a static
            graph of its own, and the planned graph keeps serving the planned size (see
            :mod:`.compile_watch`; ``recompiles`` lists the graphs compiled after the planned one).
        verbose: print the plan table at fit start and a line per epoch (rank zero).
        submodule: module path of the submodule to plan and compile (``"model"``,
            ``"model.backbone"``, ``"model.layers.0"``); checked at fit start. Default: found on the
            first batch: the LightningModule itself when ``training_step`` calls ``self(...)``, else
            the first module with trainable parameters it calls (``self.model(**batch)``: ``model``;
            the plan table names it, and a line after the first batch names the modules it also
            called outside it, a warning when one of them is larger).
        forecast_new_shapes: when a training batch has other input shapes than the planned one
            (inputs of varying length, a smaller last batch) and dynamo compiled a graph of its own
            for them with the plan, forecast a step at those shapes too, after the batch: one more
            compile on ``backend`` per shape, for the shapes of measured batches and for inputs
            larger than any forecast so far (a smaller last batch that is not measured costs
            none). The eager code after the forward (the loss, metrics) is measured at those
            shapes, as on the first batch, by the first batch of new shapes that would have been
            measured (that batch goes unmeasured: no profiler is started inside a step), else it
            is the first batch's scaled by the outputs' bytes (``scaled_eager_loss``).
            ``shape_forecasts`` holds the forecasts, and each epoch's prediction is that of the
            shapes its measured batches ran. Not under FSDP or tensor parallelism, nor with
            several forward calls per step; ``False``: none.
        batch_size: ``"max"``: before the first training step, the largest batch whose step has a plan
            within the limit (``max_memory``, else on CUDA the device's memory), from forecasts at
            candidate sizes that allocate nothing (:mod:`.batch_finder`); ``batch_arg_name`` is set
            to it where ``BatchSizeFinder`` sets it and the train dataloader is built again. The plan
            is then searched at that size. :attr:`batch_size` holds every size tried. ``None``
            (default): the batch as the dataloader makes it.
        batch_arg_name: the attribute that sets the batch size: on the LightningModule, its
            ``hparams``, the datamodule or its ``hparams``, and read by the train dataloader.

    Logged metrics, each training epoch, to every logger of the Trainer (``step`` = global step):

    - ``memplan/predicted_peak_bytes``: forecast peak of one training step above the bytes live
      when it starts (Lightning keeps the previous gradients until ``zero_grad`` inside the step,
      so they count as live at the start and are freed before backward; with
      ``accumulate_grad_batches`` > 1, the micro-batch that steps the optimizer; with manual
      optimization, above the bytes live without gradients; when ``training_step`` calls the planned
      forward several times, all of the calls, from the first batch on). When the measured
      batches ran other input shapes than the planned one (``forecast_new_shapes``), the largest
      forecast of the shapes they ran
    - ``memplan/measured_peak_bytes``: measured peak of the measured batches (max over them and
      over ranks), above the bytes live when each batch started (manual optimization: plus the
      gradients live then; automatic optimization, a batch that starts without the previous
      gradients because Lightning freed them before validation: less the gradients the baseline
      holds, so it is this step's peak above the same baseline as the prediction)
    - ``memplan/prediction_error``: (predicted - measured) / measured, signed; not logged for an
      epoch when a measured batch ran input shapes with no forecast (see ``shape_forecasts``)
    - ``memplan/budget``: the activation memory budget in force
    - ``memplan/checkpointed_blocks``: number of blocks wrapped in activation checkpointing
    - ``memplan/baseline_bytes``: bytes live before a step (parameters, buffers, batch, optimizer
      state, the previous step's gradients; of the whole LightningModule, also outside ``submodule``)
    - ``memplan/activations_bytes``, ``memplan/parameters_bytes``, ``memplan/gradients_bytes``,
      ``memplan/optimizer_state_bytes``: the forecast breakdown
    - ``memplan/fsdp_buffers_bytes`` (FSDP2 only): FSDP's all-gathered parameters and communication
      buffers live at the forecast peak

    A metric that is unknown (e.g. no batch measured yet, or a failed forecast) is not logged.
    """

    def __init__(
        self,
        budget: float | Literal["auto", "knee"] = "auto",
        *,
        max_memory: int | str | None = None,
        solver: str | Callable[..., Any] = "dp",
        checkpoint: CheckpointPolicy = "auto",
        backend: Literal["auto", "inductor", "aot_eager"] = "auto",
        candidate_budgets: Sequence[float] = DEFAULT_BUDGETS,
        search_backend: Literal["inductor", "aot_eager"] = "aot_eager",
        remat_budgets: Sequence[float] = DEFAULT_REMAT_BUDGETS,
        plan: MemPlan | str | Path | None = None,
        replan: bool = True,
        measure_batches: int = 2,
        log_plots: bool = True,
        compile_kwargs: dict[str, Any] | None = None,
        verbose: bool = True,
        submodule: str | None = None,
        forecast_new_shapes: bool = True,
        regional: bool | Literal["auto"] = "auto",
        search_time_limit: float | None = None,
        batch_size: Literal["max"] | None = None,
        batch_arg_name: str = "batch_size",
    ) -> None:
        self._options = callback_options(
            budget=budget, max_memory=max_memory, solver=solver, checkpoint=checkpoint, backend=backend,
            candidate_budgets=candidate_budgets, search_backend=search_backend, remat_budgets=remat_budgets,
            plan=plan, replan=replan, measure_batches=measure_batches, log_plots=log_plots,
            compile_kwargs=compile_kwargs, verbose=verbose, submodule=submodule,
            forecast_new_shapes=forecast_new_shapes, regional=regional, search_time_limit=search_time_limit,
            batch_size=batch_size, batch_arg_name=batch_arg_name)
        #: the arguments as given (``backend="auto"`` unresolved); ``_options`` holds them for this fit's device
        self._given = self._options
        for note in self._options.notes:  # arguments the others override
            warnings.warn(note, MemPlanWarning, stacklevel=2)
        self._settings = self._options.settings
        self._measure_batches = measure_batches
        #: Measured peak (bytes above the batch's starting bytes) of each measured batch, per epoch.
        self.measured: list[list[int]] = []
        #: The input shapes of each measured batch, aligned with :attr:`measured`: the
        #: ``planner.step_model.call_signature`` (shape, dtype, device type of each tensor argument) of the
        #: batch's first training call of the planned forward; ``None`` where it was not noted
        #: (``forecast_new_shapes=False``).
        self.measured_shapes: list[list[tuple[Any, ...] | None]] = []
        #: ``batch_size="max"``: the search's sizes, plans, forecast totals and answer (``None`` before
        #: ``fit`` starts, without the search, or on ranks other than 0).
        self.batch_size: BatchSizeChoice | None = None
        self._restored = RestoredState()  # what a checkpoint gave back, if this fit resumes from one
        self._fit = FitParts(TrainerView(None, None), self._options, lambda: self._restored.plan)

    # ------------------------------------------------------------------ results
    @property
    def plan(self) -> MemPlan | None:
        """The plan in force (``None`` before the first training batch, or after a fallback)."""
        return self._fit.plans.plan if self._fit.plans is not None else None

    @property
    def forecast(self) -> Forecast | None:
        """The forecast of the plan in force, on ``backend`` (``None`` before the first batch or on failure)."""
        return self._fit.plans.forecast if self._fit.plans is not None else None

    @property
    def fallback_reason(self) -> str | None:
        """Why the callback fell back to the uncompiled module (``None`` while it did not)."""
        return self._fit.plans.fallback_reason if self._fit.plans is not None else None

    @property
    def fallback_error(self) -> BaseException | None:
        """The error that made the callback fall back, with its whole chain (``None`` while it did not)."""
        return self._fit.plans.fallback_error if self._fit.plans is not None else None

    @property
    def timings(self) -> dict[str, float]:
        """Seconds the plan decision took (search included) and the final compile + forecast took."""
        return self._fit.plans.timings if self._fit.plans is not None else {}

    @property
    def forward_calls_per_step(self) -> int:
        """Calls of the planned forward in the first training batch (the forecast covers that many)."""
        return self._fit.profile.calls

    @property
    def eager_losses(self) -> tuple[EagerLoss, ...]:
        """The eager code between the forward and the backward (the loss on the outputs, metrics),
        measured on the first batch: one per call of the forward; empty when not measured."""
        return self._fit.profile.eager_losses

    @property
    def eager_loss(self) -> EagerLoss | None:
        """:attr:`eager_losses`' only one, when ``training_step`` calls the forward once."""
        losses = self._fit.profile.eager_losses
        return losses[0] if len(losses) == 1 else None

    @property
    def recompiles(self) -> list[CompileRecord]:
        """Graphs compiled for training after the planned one(s), in order (other input shapes)."""
        return self._fit.watch.recompiles

    @property
    def shape_forecasts(self) -> dict[tuple[Any, ...], int | None]:
        """Forecast peak (bytes above the baseline) of a step at each input shapes the fit compiled
        a graph for after the planned one, with the plan in force; ``None`` where none was made.
        Cleared when another plan is installed. See ``forecast_new_shapes``."""
        return self._fit.shapes.forecasts

    @property
    def planned_signature(self) -> tuple[Any, ...] | None:
        """The input shapes (``planner.step_model.call_signature``) the plan in force was forecast at."""
        return self._fit.shapes.planned

    # ------------------------------------------------------------------ checkpoints
    @property
    def state_key(self) -> str:
        return self.__class__.__qualname__

    @override
    def state_dict(self) -> dict[str, Any]:
        return saved_state(self.plan, self.batch_size)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored.load(state_dict, self._options)

    # ------------------------------------------------------------------ fit set-up and tear-down
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_memplan._torch.version import check_torch_version

        check_torch_version()
        self._options = self._given.on_device(trainer.strategy.root_device)
        self._settings = self._options.settings
        if self._given.settings.backend == "auto" and self._options.verbose:
            rank_zero_info(f"MemPlan: compiling with backend {self._settings.backend!r} on "
                           f"{trainer.strategy.root_device.type} (backend='auto': 'inductor' on CUDA, 'aot_eager' "
                           "elsewhere; pass backend='inductor' for inductor's kernels).")
        self._fit = FitParts(TrainerView(trainer, pl_module), self._options, lambda: self._restored.plan)
        self.measured, self.measured_shapes = [], []
        self._restored, self.batch_size = RestoredState(), None  # load_state_dict, after setup, fills it
        submodule = self._options.submodule
        if submodule is None or has_submodule(pl_module, submodule):
            self._fit.attach(resolve_submodule(pl_module, submodule, "MemPlanCallback"))
        # else configure_model makes it (it runs after setup): attached at on_fit_start

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """``batch_size="max"``: the batch size (a resumed checkpoint's, else searched). Attach to the
        planned submodule if ``configure_model`` made it, or again if it replaced it
        (``self.model = torch.compile(self.model)``); a bad ``submodule`` name fails here."""
        o, fit = self._options, self._fit
        if fit.view.lit is None:
            return
        if o.batch_size == "max":
            fit.patch.detach()  # the search runs the module's own forward; attached again below
            self._train_at_largest_batch(trainer, pl_module)
        resolved = resolve_submodule(pl_module, o.submodule, "MemPlanCallback")
        self._restored.check_blocks(pl_module, resolved if o.submodule is not None else None, o.user_plan)
        if resolved is not fit.patch.attached_to:
            fit.attach(resolved)

    def _train_at_largest_batch(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """``batch_size="max"``: the size a resumed checkpoint recorded, else the search's."""
        o = self._options
        if self._restored.batch_size is not None:
            self._restored.set_batch_size(trainer, pl_module, o.batch_arg_name)
        else:
            self.batch_size = find_batch_size(trainer, pl_module, self._settings, o.batch_arg_name, o.submodule,
                                              o.verbose)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._fit.close()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._fit.close(failed=True)

    # ------------------------------------------------------------------ each batch
    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Count the batch; measure it (a peak window) if the epoch still measures batches. On CPU
        each run of measured batches starts with a warm-up window (see :mod:`.peak_meter`)."""
        self._fit.start_batch(batch)

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        """First batch (or a batch of new shapes): measure the eager code between the forward's
        calls and the backward (the loss on the outputs, metrics)."""
        self._fit.before_backward(loss)

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """First batch: the step it showed judges the plan again and lays out its forecast. Every
        batch: report new graphs, forecast new shapes, keep the measured peak (the closed loop)."""
        self._fit.end_batch(outputs)

    # ------------------------------------------------------------------ each epoch
    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the epoch's ``memplan/*`` metrics to every logger; print a line; draw the timeline once."""
        epoch = self._fit.end_epoch(trainer.strategy)
        self.measured.append(epoch.peaks)
        self.measured_shapes.append(epoch.signatures)
        metrics = reporter.epoch_metrics(self.plan, epoch.predicted, epoch.complete, epoch.measured)
        if metrics:  # with the epoch, as Lightning's own rows have it (metrics.csv's `epoch` column)
            for logger in trainer.loggers:
                logger.log_metrics({**metrics, "epoch": trainer.current_epoch}, step=trainer.global_step)
        if self._options.verbose:
            rank_zero_info(reporter.epoch_line(trainer.current_epoch, metrics, epoch.other_shapes))
        if self._options.log_plots:
            self._fit.plot_timeline_once(trainer, epoch)
