"""plan_memory: plan before a run, reuse the JSON in the callback, leave the model untouched."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from lightning_memplan import MemPlanCallback
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.tuner import plan_memory

from .models import (
    BytesIn,
    FrozenStem,
    Recurrent,
    TinyNet,
    TwoPhaseGAN,
    UnusedHead,
    VaryingRows,
    WideHead,
    WideHeadAccuracy,
    WideHeadManual,
    WideHeadTwoViews,
    Wrapper,
)


def test_plan_memory_then_train_from_the_json(tmp_path: Path) -> None:
    model = TinyNet()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, max_epochs=1)
    plan = plan_memory(trainer, model, candidate_budgets=(1.0, 0.2), checkpoint=None, backend="aot_eager")
    # the model is as it was: weights, mode, no grads, no instance forward
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training and "forward" not in model.__dict__
    assert all(p.grad is None for p in model.parameters())
    assert [c.solver for c in plan.candidates] == ["", "", "remat", "remat", "remat"]  # two budgets, remat plans
    assert plan.predicted_peak_bytes and plan.predicted_peak_bytes > 0
    path = plan.save(tmp_path / "plan.json")
    assert MemPlan.load(path) == plan

    cb = MemPlanCallback(plan=path, backend="aot_eager")
    Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, max_epochs=1,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[cb], default_root_dir=tmp_path).fit(model)
    assert cb.plan.budget == plan.budget and cb.plan.candidates == plan.candidates
    assert cb.timings["decide_seconds"] < 1.0  # reused, not searched


class _NoSelfCall(TinyNet):
    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(x), y)


class _NoModuleCall(TinyNet):
    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(x @ self.head.weight.t(), y)


def test_plan_memory_plans_the_module_training_step_calls() -> None:
    """``self.head(x)`` in training_step: the head is planned, as ``submodule="head"`` plans it; a
    step that calls no module at all has nothing to plan."""
    trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    found = plan_memory(trainer, _NoSelfCall(), budget=0.5, backend="aot_eager")
    given = plan_memory(trainer, _NoSelfCall(), budget=0.5, backend="aot_eager", submodule="head")
    assert found.predicted_peak_bytes == given.predicted_peak_bytes is not None
    with pytest.raises(RuntimeError, match=r"`training_step` never called the module itself"):
        plan_memory(trainer, _NoModuleCall(), budget=0.5, backend="aot_eager")


def test_plan_memory_validates_arguments() -> None:
    trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    with pytest.raises(ValueError, match=r"`plan_memory\(budget=2\)` is not a valid activation memory budget"):
        plan_memory(trainer, TinyNet(), budget=2)


def test_plan_memory_warns_of_what_runs_uncompiled() -> None:
    # as the callback does (test_recurrent_modules_dynamo_runs_eagerly_warn): dynamo runs nn.LSTM
    # eagerly unless allow_rnn, so the plan misses it
    with pytest.warns(MemPlanWarning, match=r"plan_memory: the recurrent modules 'lstm' run eagerly"):
        plan_memory(_trainer(), Recurrent(), budget=0.5, backend="aot_eager")


def test_plan_memory_counts_no_gradients_for_parameters_nothing_reads() -> None:
    # the compiled forward's parameters and those the loss reads get gradients; the unused head's
    # do not: plan_memory predicts what the fit does (see test_parameters_the_step_never_uses_hold_no_gradients)
    model = UnusedHead()
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    cb = MemPlanCallback(0.5, backend="aot_eager", measure_batches=2, verbose=False, log_plots=False)
    _trainer(callbacks=[cb]).fit(model)
    unused = sum(p.numel() * 4 for p in model.unused.parameters())
    assert plan.breakdown["gradients"] == cb.plan.breakdown["gradients"] == sum(
        p.numel() * 4 for p in model.parameters()) - unused
    assert plan.predicted_peak_bytes == cb.plan.predicted_peak_bytes


def test_plan_memory_counts_no_gradients_for_parameters_read_under_no_grad() -> None:
    # a frozen stem inside the compiled forward (see the callback's test of it)
    model = FrozenStem()
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    stem = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    assert plan.breakdown["gradients"] == sum(p.numel() * 4 for p in model.parameters()) - stem
    cb = MemPlanCallback(0.5, backend="aot_eager", measure_batches=2, verbose=False, log_plots=False)
    _trainer(callbacks=[cb]).fit(model)
    # (the probe's eager loss measures 8 B less than the fit's first batch, as for WideHead)
    assert abs(plan.predicted_peak_bytes - cb.plan.predicted_peak_bytes) <= 1e-3 * cb.plan.predicted_peak_bytes


def test_plan_memory_on_the_largest_batch_predicts_the_fits_forecast_at_those_shapes() -> None:
    # inputs of varying length: plan on the largest batch (train_dataloaders takes any iterable of
    # batches); the fit then forecasts its 192-row batches as the tuner did, the eager loss
    # measured at 128 rows and scaled (callback) or measured at 192 rows (tuner)
    model = VaryingRows()
    largest = max(model.train_dataloader(), key=lambda b: b[0].shape[0])
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager", train_dataloaders=[largest])
    cb = MemPlanCallback(plan=plan, backend="aot_eager", measure_batches=4, verbose=False, log_plots=False)
    _trainer(callbacks=[cb]).fit(model)
    [at_192] = [peak for sig, peak in cb.shape_forecasts.items() if sig[0][0][0] == 192]
    assert cb.plan.predicted_peak_bytes < 0.7 * plan.predicted_peak_bytes  # the fit's first batch: 128 rows
    assert abs(at_192 - plan.predicted_peak_bytes) <= 1e-3 * plan.predicted_peak_bytes, (at_192, plan)


def test_plan_memory_runs_a_manual_optimization_step_as_fit_does() -> None:
    # training_step calls self.optimizers() and manual_backward: outside fit that raised "not
    # attached to a `Trainer`"; now the optimizers are stand-ins that step nothing and the loss is
    # the first manual_backward's, measured as the callback measures it on its first batch
    model = WideHeadManual()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and "optimizers" not in model.__dict__
    cb = MemPlanCallback(0.5, backend="aot_eager", measure_batches=2, verbose=False, log_plots=False)
    _trainer(callbacks=[cb]).fit(model)
    assert plan.predicted_peak_bytes == cb.plan.predicted_peak_bytes
    # a GAN's two phases: planned up to the first backward, with a warning, and nothing stepped
    gan = TwoPhaseGAN()
    before = {k: v.clone() for k, v in gan.state_dict().items()}
    with pytest.warns(MemPlanWarning, match=r"plan_memory: training_step ran 2 backward passes"):
        plan = plan_memory(_trainer(), gan, budget=0.5, backend="aot_eager")
    assert all(torch.equal(before[k], v) for k, v in gan.state_dict().items())
    # both Adams' state (two moments and a CPU step scalar per parameter) is in the baseline
    assert plan.breakdown["optimizer_state"] == sum(2 * p.numel() * 4 + 4 for p in gan.parameters())


def _trainer(**kw: object) -> Trainer:
    # the callback's pictures go to default_root_dir without a logger: not into the checkout
    root = tempfile.mkdtemp(prefix="memplan-test-")
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, max_epochs=1,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                   **kw)  # type: ignore[arg-type]


def test_plan_memory_plans_the_step_fit_runs_mixed_precision_and_accumulation() -> None:
    model = TinyNet(width=64, batches=8)
    plain = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    fitted = plan_memory(_trainer(precision="bf16-mixed", accumulate_grad_batches=2), model, budget=0.5,
                         backend="aot_eager")
    assert fitted.predicted_peak_bytes != plain.predicted_peak_bytes
    # what the callback forecasts inside fit, in the precision plugin's context and with accumulation
    cb = MemPlanCallback(plan=fitted, backend="aot_eager", measure_batches=4)
    _trainer(precision="bf16-mixed", accumulate_grad_batches=2, callbacks=[cb]).fit(model)
    assert cb.fallback_reason is None
    assert cb.plan.predicted_peak_bytes == fitted.predicted_peak_bytes


def test_plan_memory_plans_a_submodule_and_the_callback_reuses_it() -> None:
    wrapper = Wrapper()
    found = plan_memory(_trainer(), wrapper, budget=0.5, backend="aot_eager")  # training_step calls self.model
    plan = plan_memory(_trainer(), wrapper, budget=0.5, backend="aot_eager", submodule="model")
    assert plan.predicted_peak_bytes and plan.predicted_peak_bytes == found.predicted_peak_bytes
    assert not any("forward" in m.__dict__ for m in wrapper.modules())
    cb = MemPlanCallback(plan=plan, backend="aot_eager", submodule="model")
    _trainer(callbacks=[cb]).fit(wrapper)
    assert cb.fallback_reason is None and cb.plan.predicted_peak_bytes == plan.predicted_peak_bytes


def test_plan_memory_plans_what_the_user_compiled_and_gives_the_compile_back() -> None:
    """A submodule the user compiled (``self.model = torch.compile(net)``) is the wrapper with no
    forward of its own: plan_memory failed on it. A LightningModule given as ``torch.compile(model)``
    is planned as the module it wraps. Both plans equal the plan of the uncompiled module."""
    wrapper = Wrapper()
    plain = plan_memory(_trainer(), wrapper, budget=0.5, backend="aot_eager", submodule="model")
    wrapper.model = torch.compile(wrapper.model, backend="aot_eager")
    compiled = wrapper.model.forward
    plan = plan_memory(_trainer(), wrapper, budget=0.5, backend="aot_eager", submodule="model")
    assert plan.predicted_peak_bytes == plain.predicted_peak_bytes
    assert wrapper.model.forward is compiled and "forward" not in wrapper.model._orig_mod.__dict__
    model = WideHead()
    plain = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    plan = plan_memory(_trainer(), torch.compile(model, backend="aot_eager"), budget=0.5, backend="aot_eager")
    assert plan.predicted_peak_bytes == plain.predicted_peak_bytes


@pytest.mark.parametrize("compile_there", [False, True], ids=["made", "compiled"])
def test_plan_memory_calls_configure_model_as_fit_does(compile_there: bool) -> None:
    """A submodule ``configure_model`` makes (or compiles): plan_memory failed with "no submodule"
    (or planned the uncompiled module the user's compile then replaced in fit). The fit reuses the
    plan without searching."""
    from .test_callback import _MadeInConfigureModel

    model = _MadeInConfigureModel(compile_there)
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager", submodule="model")
    assert plan.predicted_peak_bytes
    cb = MemPlanCallback(plan=plan, backend="aot_eager", submodule="model")
    _trainer(callbacks=[cb]).fit(model)
    assert cb.fallback_reason is None and cb.plan.predicted_peak_bytes == plan.predicted_peak_bytes


def test_plan_memory_forecasts_calls_of_other_shapes_as_fit_does() -> None:
    """A labeled and a 4x larger unlabeled call per step: the plan covers both calls' own graphs,
    and the fit predicts the same (before: the first call laid out twice)."""
    from .test_callback import _SemiSupervised

    model = _SemiSupervised(width=64, batch=64, batches=6)
    plan = plan_memory(_trainer(), model, budget=0.5, backend="aot_eager")
    cb = MemPlanCallback(plan=plan, backend="aot_eager", measure_batches=2)
    _trainer(callbacks=[cb]).fit(model)
    assert cb.fallback_reason is None and cb.forecast.calls == 2
    assert plan.predicted_peak_bytes == pytest.approx(cb.plan.predicted_peak_bytes, rel=0.001)
    assert plan.predicted_peak_bytes == pytest.approx(max(cb.measured[0]), rel=0.01)


@pytest.mark.parametrize("model_cls", [WideHeadAccuracy, WideHeadTwoViews, BytesIn],
                         ids=["metric", "two-calls", "made-inputs"])
def test_plan_memory_measures_the_eager_code_on_the_outputs(model_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan_memory runs training_step once (the forward without autograd) and lays the loss and
    the metric it computes on the outputs, every call of the forward and the inputs it makes into
    the plan: the
    callback's prediction inside fit is the tuner's. Before, the tuner stopped at the first call
    and its plan was 59% low on the dogfood language model (38.6 MB against 93.8 MB measured)."""
    import lightning_memplan.tuner as tuner_mod

    model = model_cls()
    with monkeypatch.context() as m:
        m.setattr(tuner_mod, "probe_step", lambda *a, **k: None)  # the compiled forward alone
        alone = plan_memory(_trainer(), model, budget=1.0, backend="aot_eager")
    plan = plan_memory(_trainer(), model, budget=1.0, backend="aot_eager")
    assert "forward" not in model.__dict__ and "log" not in model.__dict__
    if model_cls is WideHeadAccuracy:  # the metric saw no batch
        assert model.acc._update_count == 0 and not model.acc.tp.any()
    cb = MemPlanCallback(plan=plan, backend="aot_eager", measure_batches=2)
    _trainer(callbacks=[cb]).fit(model)
    assert cb.fallback_reason is None and len(cb.eager_losses) == cb.forward_calls_per_step
    # both measure the eager code on a real step: a few KB apart at most (16 KB of 8.9 MB once, in
    # the full suite's process)
    assert abs(cb.plan.predicted_peak_bytes - plan.predicted_peak_bytes) <= 1e-2 * plan.predicted_peak_bytes
    measured = max(max(m) for m in cb.measured)  # above the step's starting bytes
    assert abs(plan.predicted_peak_bytes / measured - 1) < 0.03
    if model_cls is BytesIn:  # the float input it makes is in the step, not in the baseline
        assert plan.predicted_peak_bytes == alone.predicted_peak_bytes + 64 * 256 * 4
    else:
        assert alone.predicted_peak_bytes < 0.8 * measured


class _Batched(TinyNet):
    """TinyNet whose dataloader takes its batch size from ``self.batch_size``, as BatchSizeFinder expects."""

    def __init__(self, batch_size: int = 32, rows: int = 2048, follow: bool = True, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.batch_size, self._rows, self._follow = batch_size, rows, follow

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self._rows, self._width, generator=g)
        data = torch.utils.data.TensorDataset(x, x[:, :1].clone())
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size if self._follow else 32)


def _cpu_trainer(tmp_path: Path, **kw: object) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_plan_memory_finds_the_largest_batch_that_fits_and_a_fit_at_it_stays_under_the_limit(tmp_path: Path) -> None:
    limit = 20 * 2**20
    model = _Batched(width=256, depth=3, rows=8192)
    plan = plan_memory(_cpu_trainer(tmp_path), model, max_memory=limit, batch_size="max", backend="aot_eager")
    trials = {t["batch_size"]: t for t in plan.batch_trials}
    assert plan.batch_size == model.batch_size and trials[plan.batch_size]["fits"]
    assert plan.batch_size > 32  # the start fits with room: it grew
    assert all(t["fits"] == (b <= plan.batch_size) for b, t in trials.items()), trials  # one boundary
    assert any(b > plan.batch_size for b in trials)  # a larger size was tried and does not fit
    assert plan.baseline_bytes + plan.predicted_peak_bytes <= limit
    # the plan was chosen on a batch of that size, and a real fit at it stays under the limit
    cb = MemPlanCallback(plan=plan, measure_batches=2, log_plots=False, verbose=False)
    _cpu_trainer(tmp_path, max_epochs=1, limit_train_batches=6, callbacks=[cb]).fit(model)
    assert cb.fallback_reason is None and cb.measured[0], (cb.fallback_reason, cb.measured)
    assert cb.plan.baseline_bytes + max(cb.measured[0]) <= limit, (cb.plan.baseline_bytes, cb.measured)
    saved = MemPlan.load(plan.save(tmp_path / "plan.json"))
    assert saved.batch_size == plan.batch_size and saved.batch_trials == plan.batch_trials


def test_plan_memory_batch_size_max_refuses_what_it_cannot_search(tmp_path: Path) -> None:
    trainer = _cpu_trainer(tmp_path)
    with pytest.raises(ValueError, match=r"`plan_memory\(batch_size='huge'\)` is not valid\. Expected 'max'"):
        plan_memory(trainer, _Batched(), batch_size="huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch_arg_name='bs'\)`: no attribute 'bs' in the model, its hparams\. "):
        plan_memory(trainer, _Batched(), batch_size="max", batch_arg_name="bs", max_memory="1GiB")
    with pytest.raises(ValueError, match=r"needs a memory limit to fit: on cpu there is no device limit"):
        plan_memory(trainer, _Batched(), batch_size="max")
    with pytest.raises(ValueError, match=r"train_dataloaders=\.\.\.\)`: a dataloader given as it is cannot be built"):
        plan_memory(trainer, _Batched(), batch_size="max", max_memory="1GiB",
                    train_dataloaders=_Batched().train_dataloader())
    with pytest.raises(ValueError, match=r"made a batch of \[32\] rows with batch_size=16, so it does not build"):
        plan_memory(trainer, _Batched(batch_size=16, follow=False), batch_size="max", max_memory="1GiB")
