"""The callback's per-fit parts, each without a Trainer (the Trainer tests are in test_callback.py)."""
from __future__ import annotations

import dataclasses
import re
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from lightning_memplan.callback.called_module import FirstBatchCalls
from lightning_memplan.callback.checkpoint_state import RestoredState, saved_state
from lightning_memplan.callback.compile_watch import CompileRecord
from lightning_memplan.callback.epoch_result import end_epoch
from lightning_memplan.callback.first_batch import FirstBatchProfile, held_returned
from lightning_memplan.callback.forward_patch import ForwardPatch
from lightning_memplan.callback.options import callback_options
from lightning_memplan.callback.peak_meter import PeakMeter
from lightning_memplan.callback.phase import FitProgress, Phase
from lightning_memplan.callback.recompiles import RecompileWatch
from lightning_memplan.callback.reporter import candidates_table, epoch_line, epoch_metrics, plan_table, regions_phrase
from lightning_memplan.callback.shapes import ShapeCall, ShapeTracker
from lightning_memplan.callback.trainer_view import TrainerView
from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.plan import Candidate, MemPlan
from lightning_memplan.planner.messages import MemPlanWarning
from lightning_memplan.planner.search import DEFAULT_BUDGETS, DEFAULT_REMAT_BUDGETS
from lightning_memplan.planner.settings import has_submodule
from lightning_memplan.planner.step_model import call_signature

pytestmark = pytest.mark.unit


def _plan(**kw: Any) -> MemPlan:
    base: dict[str, Any] = dict(budget=0.5, solver="dp", backend="aot_eager", checkpoint=("blocks.0",),
                                predicted_peak_bytes=1000, baseline_bytes=300, reason="given",
                                breakdown={"activations": 700, "gradients": 200, "parameters": 100})
    base.update(kw)
    return MemPlan(**base)


def _options(**kw: Any) -> Any:
    args: dict[str, Any] = dict(budget=0.5, max_memory=None, solver="dp", checkpoint=None, backend="aot_eager",
                                candidate_budgets=(1.0, 0.5), search_backend="aot_eager", remat_budgets=(),
                                plan=None, replan=True, measure_batches=2, log_plots=False, compile_kwargs=None,
                                verbose=False, submodule=None, forecast_new_shapes=True, regional="auto",
                                search_time_limit=None)
    args.update(kw)
    return callback_options(**args)


# ---------------------------------------------------------------------------- phase
def test_fit_progress_names_the_phase_of_each_batch() -> None:
    progress = FitProgress()
    assert progress.phase is Phase.BEFORE and not progress.first and not progress.later
    progress.start_batch()
    assert progress.phase is Phase.FIRST and progress.first
    progress.start_batch()
    assert progress.phase is Phase.LATER and progress.later and progress.batches == 2


# ---------------------------------------------------------------------------- peak meter
def test_the_peak_meter_keeps_a_window_after_a_warm_up_and_shifts_it() -> None:
    meter = PeakMeter(measure_batches=2)
    cpu = torch.device("cpu")
    results = []
    for shift in (0, 1000, -10**9):
        meter.open(cpu, shift)
        keep = torch.empty(1024, dtype=torch.uint8)
        peak = meter.close()
        del keep
        assert peak is not None
        results.append((meter.would_keep(peak), meter.finish_batch(peak, ("sig",))))
    # the first window of a run is a warm-up on CPU; the shift is added; never below 0
    assert results[0] == (False, None)
    assert results[1][0] and results[1][1] is not None and results[1][1] >= 1000 + 1024
    assert results[2] == (True, 0)
    peaks, sigs = meter.end_epoch()
    assert len(peaks) == 2 and sigs == [("sig",), ("sig",)] and meter.wants_batch()


def test_a_discarded_window_and_no_window_are_not_kept() -> None:
    meter = PeakMeter(measure_batches=1)
    assert meter.close() is None and meter.finish_batch(None, None) is None
    meter.open(torch.device("cpu"), 0)
    meter.finish_batch(meter.close(), None)  # warm-up
    meter.open(torch.device("cpu"), 0)
    meter.discard = True
    peak = meter.close()
    assert not meter.would_keep(peak) and meter.finish_batch(peak, None) is None and not meter.discard
    assert meter.end_epoch() == ([], [])


# ---------------------------------------------------------------------------- shapes
def test_the_shape_tracker_predicts_an_epoch_from_the_shapes_it_ran() -> None:
    shapes = ShapeTracker()
    x, y = torch.zeros(4, 8), torch.zeros(6, 8)
    planned = shapes.plan_installed((x,), {})
    other = call_signature((y,), {})
    assert planned == call_signature((x,), {}) and shapes.forecast_input_bytes == 4 * 8 * 4
    plan = _plan()
    assert shapes.epoch_prediction(plan, []) == (1000, True)
    assert shapes.epoch_prediction(plan, [planned, other]) == (1000, False)  # no forecast for `other`
    shapes.forecasts[other] = 1500
    assert shapes.epoch_prediction(plan, [planned, other, None]) == (1500, True)
    assert shapes.epoch_prediction(None, [planned]) == (None, False)
    shapes.plan_installed((x,), {})  # another plan: its own graphs and forecasts
    assert shapes.forecasts == {} and shapes.compiled == set()


def test_a_batch_of_new_shapes_measures_its_eager_code_only_when_it_would_be_measured_or_larger() -> None:
    shapes = ShapeTracker()
    small, large = torch.zeros(2, 8), torch.zeros(64, 8)
    shapes.plan_installed((torch.zeros(4, 8),), {})
    assert not shapes.start_batch(small, track=True, later=False, profiled=True, measured_eager=True)  # first
    assert shapes.start_batch(large, track=True, later=True, profiled=True, measured_eager=True)
    sig = call_signature((large,), {})
    assert shapes.wants_eager_at(sig, (large,), {}, steady=True)
    assert not shapes.wants_eager_at(sig, (large,), {}, steady=False)
    # a later batch of shapes already seen, or one past the measured ones that is not larger
    assert not shapes.start_batch(large, track=True, later=True, profiled=True, measured_eager=True)
    assert not shapes.wants_eager_at(sig, (large,), {}, steady=True)
    tiny = torch.zeros(1, 8)
    assert not shapes.start_batch(tiny, track=True, later=True, profiled=False, measured_eager=True)
    assert not shapes.wants_eager_at(call_signature((tiny,), {}), (tiny,), {}, steady=True)
    assert not shapes.start_batch(torch.zeros(3, 3), track=False, later=True, profiled=True, measured_eager=True)


def test_the_eager_code_at_other_shapes_is_measured_else_scaled_by_the_outputs() -> None:
    loss = EagerLoss(outputs_bytes=100, outputs_kept_bytes=0, kept_bytes=100, backward_peak_bytes=200,
                     output_grad_bytes=100, forward_peak_bytes=100)
    shapes = ShapeTracker()
    (scaled,) = shapes.eager_at(("s",), 300, (loss,), 100)
    assert scaled.outputs_bytes == 300 and scaled.backward_peak_bytes == 600
    shapes.eager[("s",)] = (loss,)
    assert shapes.eager_at(("s",), 300, (), 100) == (loss,)


def test_a_batch_end_says_what_the_batch_ran_and_whether_its_shapes_are_forecast() -> None:
    shapes = ShapeTracker()
    shapes.plan_installed((torch.zeros(4, 8),), {})
    sig = call_signature((torch.zeros(6, 8),), {})
    call = ShapeCall(args=(), kwargs={}, out_bytes=0, made_bytes=0, in_bytes=10)  # smaller than the planned inputs
    shapes.batch_sig, shapes.batch_call, shapes.batch = sig, call, "the batch"
    ran = shapes.end_batch(None, new_static_graph=True)
    assert (ran.signature, ran.call, ran.noted) == (sig, call, None) and sig in shapes.compiled
    assert shapes.batch is None and shapes.batch_call is None
    assert not shapes.wants_forecast(ran, measured=False) and shapes.wants_forecast(ran, measured=True)
    larger = dataclasses.replace(call, in_bytes=10**6)
    assert shapes.wants_forecast(dataclasses.replace(ran, call=larger), measured=False)
    shapes.noting = sig  # the batch measured the eager code at its shapes
    shapes.batch_sig, shapes.batch_call = sig, call
    ran = shapes.end_batch(None, new_static_graph=False)
    assert ran.noted == sig and shapes.noting is None and shapes.wants_forecast(ran, measured=False)
    assert not shapes.wants_forecast(dataclasses.replace(ran, call=None), measured=True)


def test_an_epoch_result_is_the_largest_peak_and_the_forecast_of_the_shapes_it_ran() -> None:
    meter, shapes = PeakMeter(measure_batches=3), ShapeTracker()
    planned = shapes.plan_installed((torch.zeros(4, 8),), {})
    other = call_signature((torch.zeros(6, 8),), {})
    meter.peaks, meter.signatures = [900, 1400], [planned, other]
    shapes.forecasts[other] = 1500
    epoch = end_epoch(meter, shapes, _plan(), None, shapes_per_rank=True)
    assert (epoch.measured, epoch.predicted, epoch.complete) == (1400, 1500, True)
    assert epoch.at_planned == 900 and epoch.other_shapes == 1 and epoch.peaks == [900, 1400]
    assert meter.peaks == []  # the next epoch starts empty
    epoch = end_epoch(meter, shapes, _plan(), None, shapes_per_rank=False)
    assert (epoch.measured, epoch.predicted, epoch.complete, epoch.at_planned) == (None, 1000, True, None)


# ---------------------------------------------------------------------------- first batch
def test_the_first_batch_profile_notes_calls_of_other_shapes_and_returned_outputs() -> None:
    profile = FirstBatchProfile()
    x = torch.zeros(4, 8)
    profile.note_call((x,), {})
    profile.note_call((x[:2],), {})
    profile.note_call((torch.zeros(2, 8),), {})
    assert profile.calls == 3 and len(profile.other_calls) == 1 and len(profile.signatures) == 3
    profile.batch = x
    profile.finish(None, nn.Linear(8, 8))
    assert profile.made_inputs == 0  # a view of the batch is not made in the step
    kept = torch.zeros(10)
    loss = EagerLoss(outputs_bytes=40, outputs_kept_bytes=0, kept_bytes=0, backward_peak_bytes=0,
                     output_grad_bytes=0, forward_peak_bytes=0,
                     inner_outputs=((kept.untyped_storage()._cdata, 40), (1, 8)))
    (held,) = held_returned((loss,), {"logits": kept})
    assert held.held_inner_bytes == 40


def test_the_eager_code_is_measured_only_when_every_call_was_noted_and_the_loss_has_a_graph() -> None:
    profile = FirstBatchProfile()
    profile.note_call((torch.zeros(2),), {})
    assert profile.backward_starts(first=True) is None and profile.backwards == 1
    calls = SimpleNamespace(calls=[SimpleNamespace(edges=[object()])])
    w = torch.ones(2, requires_grad=True)
    assert profile.can_measure(calls, (w * 2).sum())
    assert not profile.can_measure(None, (w * 2).sum())
    assert not profile.can_measure(calls, torch.ones(()))  # no autograd graph
    assert not profile.can_measure(calls, 1.0)
    assert not profile.can_measure(SimpleNamespace(calls=[SimpleNamespace(edges=[])]), (w * 2).sum())
    profile.note_call((torch.zeros(2),), {})  # two calls, one noted
    assert not profile.can_measure(calls, (w * 2).sum())


# ---------------------------------------------------------------------------- module calls
def test_the_first_batch_calls_plan_the_first_module_with_parameters_and_put_every_forward_back() -> None:
    lit = nn.Module()
    lit.norm, lit.model, lit.head = nn.Identity(), nn.Linear(4, 4), nn.Linear(4, 64)
    calls = FirstBatchCalls()
    asked: list[str] = []
    calls.open(lit, lambda call: asked.append(call.path) or (lambda x: x * 0))  # type: ignore[func-returns-value]
    out = lit.head(lit.model(lit.norm(torch.ones(1, 4))))
    assert asked == ["model"] and out.shape == (1, 64)
    with pytest.warns(MemPlanWarning, match="submodule='head'"):  # it holds more parameters than the planned
        called = calls.end(verbose=False)
    assert [c.path for c in called] == ["norm", "model", "head"]
    assert all("forward" not in m.__dict__ for m in (lit.norm, lit.model, lit.head))
    assert calls.end(verbose=False) == []
    calls.open(lit, lambda call: None)
    calls.lightning_module_called()  # self(...) came first: nothing is watched any more
    assert all("forward" not in m.__dict__ for m in (lit.norm, lit.model, lit.head))
    calls.close()


# ---------------------------------------------------------------------------- checkpoint state
def test_the_checkpoint_state_gives_back_the_plan_and_batch_size_and_drops_what_cannot_serve() -> None:
    options = _options(budget="auto")
    state = saved_state(_plan(), None)
    assert state["format"] == 1 and state["batch_size"] is None
    restored = RestoredState()
    restored.load({**state, "batch_size": 64}, options)
    assert restored.plan is not None and restored.plan.budget == 0.5 and restored.batch_size == 64
    empty = RestoredState()
    empty.load({}, options)  # an older checkpoint's state
    assert empty.plan is None and empty.batch_size is None
    unknown = RestoredState()
    with pytest.warns(MemPlanWarning, match="not known.*Planning afresh"):
        unknown.load(saved_state(_plan(solver="mine"), None), options)
    assert unknown.plan is None
    model = nn.Module()
    with pytest.warns(MemPlanWarning, match="Planning afresh"):  # the plan's block `blocks.0` is gone
        restored.check_blocks(model, None, None)
    assert restored.plan is None


# ---------------------------------------------------------------------------- recompiles
def test_the_recompile_watch_reports_new_graphs_and_warns_once_for_a_dynamic_one() -> None:
    backend = SimpleNamespace(compiles=[CompileRecord(input_shapes=((4, 8),), dynamic=False, training=True)])
    watch = RecompileWatch(verbose=False)
    watch.follow(backend, ((4, 8),))  # type: ignore[arg-type]
    assert watch.planned_compiled() is backend.compiles[0]
    backend.compiles += [CompileRecord(input_shapes=((2, 8),), dynamic=False, training=True),
                         CompileRecord(input_shapes=((2, 8),), dynamic=False, training=False),
                         CompileRecord(input_shapes=((3, 8),), dynamic=True, training=True)]
    with pytest.warns(MemPlanWarning, match=r"batch 7 compiled a dynamic-shape graph"):
        watch.check(7)
    assert [r.input_shapes for r in watch.recompiles] == [((2, 8),), ((3, 8),)]  # training graphs only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch.check(8)  # nothing new: nothing said


# ---------------------------------------------------------------------------- forward patch
def test_the_forward_patch_routes_the_forward_and_puts_it_back() -> None:
    lit = nn.Sequential(nn.Linear(2, 2))
    inner = lit[0]
    assert has_submodule(lit, "0") and not has_submodule(lit, "model")
    patch = ForwardPatch()
    calls: list[Any] = []
    patch.attach(lit, inner, lambda *a: calls.append(a) or "routed", backend="aot_eager")
    assert inner(torch.zeros(2)) == "routed" and patch.module is inner and patch.original is not None
    assert patch.original(torch.zeros(2)).shape == (2,)  # the forward as it was
    patch.detach()
    assert "forward" not in inner.__dict__ and inner(torch.zeros(2)).shape == (2,)
    patch.detach()  # twice: nothing


# ---------------------------------------------------------------------------- trainer view
def test_the_trainer_view_without_a_trainer() -> None:
    view = TrainerView(None, None)
    view.module = nn.Linear(2, 2)
    assert view.strategy is None and view.world_size == 1 and view.optimizer() is None
    assert view.training() and view.device() == torch.device("cpu")
    with view.step_context():
        pass


# ---------------------------------------------------------------------------- options
@pytest.mark.parametrize(("kw", "match"), [
    ({"measure_batches": 0}, r"measure_batches=0\)` must be an int >= 1"),
    ({"measure_batches": True}, r"measure_batches=True"),
    ({"compile_kwargs": [1]}, r"compile_kwargs=\[1\]\)` must be a dict"),
    ({"compile_kwargs": {"backend": "eager"}}, r"set the backend with `backend=`"),
    ({"forecast_new_shapes": "yes"}, r"forecast_new_shapes='yes'\)` must be True or False"),
    ({"regional": "yes"}, r"regional='yes'\)` is not valid. Expected True \(compile the repeated blocks.*or 'auto'"),
    ({"search_time_limit": 0}, r"search_time_limit=0\)` is not valid. Expected a positive number of seconds, or None"),
    ({"search_time_limit": -5.0}, r"search_time_limit=-5.0\)` is not valid"),
    ({"search_time_limit": float("inf")}, r"search_time_limit=inf\)` is not valid"),
    ({"search_time_limit": float("nan")}, r"search_time_limit=nan\)` is not valid"),
    ({"search_time_limit": True}, r"search_time_limit=True\)` is not valid"),
    ({"search_time_limit": "60s"}, r"search_time_limit='60s'\)` is not valid"),
    ({"plan": 3}, r"plan=3\)` must be a MemPlan"),
    ({"plan": "/no/such/plan.json"}, r"no such file"),
])
def test_bad_callback_arguments_are_named(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _options(**kw)


def test_good_callback_arguments_are_kept() -> None:
    plan = _plan()
    options = _options(plan=plan, compile_kwargs={"mode": "default"}, max_memory="1KiB")
    assert options.user_plan is plan and options.compile_kwargs == {"mode": "default"}
    assert options.settings.max_memory == 1024 and options.measure_batches == 2
    assert _options(search_time_limit=30).settings.search_time_limit == 30.0
    assert _options().settings.search_time_limit is None


def test_search_arguments_beside_a_plan_are_said_to_be_unused() -> None:
    # plan= is used as it is: budget=, max_memory= (and solver=, ...) given beside it are named
    defaults = dict(checkpoint="auto", candidate_budgets=DEFAULT_BUDGETS, remat_budgets=DEFAULT_REMAT_BUDGETS)
    options = _options(plan=_plan(), max_memory="1KiB", **defaults)
    assert options.notes == ("`MemPlanCallback(plan=...)` is used as it is (no search), so budget=0.5, "
                             "max_memory='1KiB' are not used. Drop `plan=` to search with them.",)
    assert _options(plan=_plan(), budget="auto", **defaults).notes == ()
    assert "search_time_limit=30 is not used" in _options(plan=_plan(), budget="auto", search_time_limit=30,
                                                          **defaults).notes[0]
    assert _options(budget=0.5, max_memory="1KiB").notes == ()  # no plan: nothing overrides them
    assert "regional=False is not used" in _options(plan=_plan(), budget="auto", regional=False, **defaults).notes[0]

    def mine(memory: list[float], runtimes: list[float], max_memory: float) -> Any:
        raise AssertionError

    custom = _plan(solver="custom:mine")
    assert _options(plan=custom, solver=mine, budget="auto", **defaults).notes == ()  # the plan's own solver
    assert "solver=<function" in _options(plan=_plan(), solver=mine, budget="auto", **defaults).notes[0]


@pytest.mark.parametrize(("solver", "match"), [
    ("nope", r"`MemPlanCallback\(plan='.*p\.json'\)`: the plan names the solver 'nope', which is not known\. "
             r"Expected one of 'greedy', 'dp'"),
    ("custom:mine", r"made with the custom solver 'mine'; pass that function as `solver=`"),
])
def test_a_plan_file_naming_a_solver_that_cannot_run_is_refused(tmp_path: Any, solver: str, match: str) -> None:
    path = _plan(solver=solver).save(tmp_path / "p.json")
    with pytest.raises(ValueError, match=match):
        _options(plan=str(path), budget="auto")


def test_a_plan_checkpointing_blocks_the_model_lacks_is_refused() -> None:
    from lightning_memplan.planner.given_plan import check_plan_blocks

    lit = nn.Module()
    lit.model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    check_plan_blocks(_plan(checkpoint=("1",)), lit, "src")  # lit.model has a block "1"
    check_plan_blocks(_plan(checkpoint=("model.1",)), lit, "src")  # lit itself has "model.1"
    check_plan_blocks(_plan(checkpoint=()), lit, "src")
    with pytest.raises(ValueError, match=r"^src: the plan checkpoints \['blocks\.0'\], which Module or any of its "
                                         r"submodules does not have \(its children: \['model'\]\)"):
        check_plan_blocks(_plan(checkpoint=("blocks.0",)), lit, "src")
    with pytest.raises(ValueError, match=r"checkpoints \['model\.1'\], which Sequential does not have"):
        check_plan_blocks(_plan(checkpoint=("model.1",)), lit, "src", planned=lit.model)
    check_plan_blocks(dataclasses.replace(_plan(checkpoint=()), regional=("1",)), lit, "src")
    with pytest.raises(ValueError, match=r"src: the plan compiles on their own \['layers.3'\], which"):
        check_plan_blocks(dataclasses.replace(_plan(checkpoint=()), regional=("layers.3",)), lit, "src")


def test_resume_conflicts_say_which_wins() -> None:
    from lightning_memplan.planner.given_plan import resume_conflicts

    restored = _plan(budget=0.5, solver="dp", checkpoint=())
    same = dict(user_plan=None, budget="auto", solver_name="dp", max_memory=None)
    assert resume_conflicts("CB", restored, **same) == []
    [budget] = resume_conflicts("CB", restored, **{**same, "budget": 0.3})
    assert budget.startswith("`CB(budget=0.3)` differs from the checkpoint's plan (budget 0.5, solver 'dp'); resuming "
                             "with the checkpoint's plan")
    [solver] = resume_conflicts("CB", restored, **{**same, "solver_name": "greedy"})
    assert "`CB(solver='greedy')` differs" in solver and "pass `CB(plan=MemPlan(...))`" in solver
    [fits] = resume_conflicts("CB", restored, **{**same, "max_memory": 2000})
    assert "not searching against max_memory (its forecast 1.27 KiB is within it)" in fits
    [over] = resume_conflicts("CB", restored, **{**same, "max_memory": 1000})
    assert "is OVER it" in over
    [given] = resume_conflicts("CB", restored, **{**same, "user_plan": _plan(budget=0.2, checkpoint=())})
    assert given.endswith("resuming with `plan=`, as given.")
    assert resume_conflicts("CB", restored, **{**same, "user_plan": _plan(checkpoint=(), reason="other")}) == []


def test_error_summary_is_the_root_cause_in_one_line() -> None:
    from lightning_memplan.planner.messages import error_summary

    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer\nsecond line") from inner
    except RuntimeError as exc:
        assert error_summary(exc) == "RuntimeError: outer (from KeyError: 'inner')"
    assert error_summary(ValueError("a\n  b")) == "ValueError: a"
    assert error_summary(ValueError()) == "ValueError"
    assert error_summary(ValueError("x" * 500), limit=20) == "ValueError: xxxxx..."
    wrapped = RuntimeError("backend='memplan' raised:")
    wrapped.inner_exception = TypeError("bad graph\nmore")  # type: ignore[attr-defined]  # torch's wrapper
    assert error_summary(wrapped) == "RuntimeError: backend='memplan' raised: (from TypeError: bad graph)"


# ---------------------------------------------------------------------------- reporter
def test_the_epoch_metrics_and_their_error() -> None:
    plan = _plan()
    m = epoch_metrics(plan, 1000, True, 800)
    assert m["memplan/predicted_peak_bytes"] == 1000 and m["memplan/measured_peak_bytes"] == 800
    assert m["memplan/prediction_error"] == pytest.approx(0.25) and m["memplan/checkpointed_blocks"] == 1
    assert m["memplan/activations_bytes"] == 700 and "memplan/optimizer_state_bytes" not in m
    assert "memplan/prediction_error" not in epoch_metrics(plan, 1000, False, 800)  # a shape had no forecast
    assert epoch_metrics(None, None, False, None) == {}
    line = epoch_line(3, m, other_shapes=2)
    assert line.startswith("MemPlan epoch 3: predicted") and "+25.0%" in line and "2 other input shape" in line


def test_the_plan_table_names_the_knee_and_the_decision_time() -> None:
    cands = (Candidate(budget=1.0, peak_bytes=2000, cost=1.0), Candidate(budget=0.5, peak_bytes=1000, cost=2.0))
    text = plan_table(_plan(candidates=cands, knee=1, chosen=1),
                      {"decide_seconds": 2.0, "install_seconds": 4.0})
    flat = " ".join(text.split())  # values wrap to the table's width
    assert "knee" in text and "budget 0.5" in text and "the search took 0.5x one compile" in flat and "blocks.0" in text
    # the choice in plain words, against no plan and against the least memory
    assert "budget 0.5: 1000 B, 50% less than no plan's 1.95 KiB, for +100% estimated compute" in flat
    noted = plan_table(_plan(notes=("region 0: solver not called (budget_1)",)), {})
    assert "partitioner          1 region: default" in noted


def test_the_plan_table_says_the_partitioner_in_one_phrase() -> None:
    notes = tuple(f"region {i}: solver not called (budget_1)" for i in (0, 2, 3, 4, 5)) + (
        "region 1: solver not called (unknown)",)
    text = plan_table(_plan(notes=notes), {})
    rows = [line for line in text.splitlines() if line.lstrip().startswith("partitioner")]
    assert rows == ["  partitioner          6 regions: 5 default, 1 not partitioned"], text
    assert "budget_1" not in text and "(unknown)" not in text and "region 1" not in text
    # the search's own plan carries the chosen candidate's note: the same phrase
    searched = plan_table(_plan(notes=("solver called; solver called; solver not called (min_cut_below_inputs)",)), {})
    assert "3 regions: 2 solved, 1 default" in searched


def test_regions_phrase_counts_each_outcome() -> None:
    assert regions_phrase(["budget_1"] * 6) == "6 regions: default"
    assert regions_phrase(["solved", "min_cut_below_inputs", "budget_1"]) == "3 regions: 2 default, 1 solved"
    assert regions_phrase(["solved", "solved", "unknown"], "remat") == "3 regions: 2 remat, 1 not partitioned"
    assert regions_phrase(["budget_0"]) == "1 region: inputs only"


#: What a table a person reads must not show: the partitioner's codes and notes, the forecast's
#: consistency notes, raw byte counts (issue 49).
_INTERNAL = ("solver not called", "solver called", "partitioner was not observed", "allocator model", "budget_1",
             "min_cut_below_inputs", "(unknown)", "timeline at")

#: A note of the forecast's, as a CUDA forecast writes it when two of its models disagree.
_ALLOCATOR_NOTE = ("the step's allocations peak at 12197896 bytes, the timeline at 11935752: the CUDA allocator "
                   "model was not run")


def _assert_readable(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 100]
    assert not wide, f"wider than 100 columns: {wide}"
    shown = [word for word in _INTERNAL if word in text]
    assert not shown, f"internal notes shown: {shown}\n{text}"
    assert not re.search(r"\d{5,} bytes", text), text


def _searched_plan(**kw: Any) -> MemPlan:
    """A search's plan as the demo's is: knapsack plans with the partitioner's note per region (one
    carrying a CUDA consistency note), checkpointed blocks of long names, whole-graph remat plans,
    one failed forecast."""
    regions = "; ".join(["solver not called (budget_1)"] * 6)
    mixed = "; ".join(["solver not called (min_cut_below_inputs)"] * 4 + ["solver called"] * 2)
    blocks = tuple(f"model.decoder.layers.{i}.self_attention" for i in range(2))
    remat = "; ".join(["solver called"] * 6)
    cands = (
        Candidate(budget=1.0, peak_bytes=11 * 2**20, cost=6.3e8, note=f"{regions}; {_ALLOCATOR_NOTE}"),
        Candidate(budget=0.3, peak_bytes=8 * 2**20, cost=6.9e8, note=mixed),
        Candidate(budget=1.0, checkpoint=blocks[:1], peak_bytes=10 * 2**20, cost=6.9e8, note=regions),
        Candidate(budget=0.3, checkpoint=blocks, peak_bytes=7 * 2**20, cost=7.6e8, note=f"{mixed}; {mixed}"),
        Candidate(budget=0.55, peak_bytes=9 * 2**20, cost=6.3e8, note=remat, solver="remat"),
        Candidate(budget=0.4, peak_bytes=int(7.9 * 2**20), cost=6.8e8, note=remat, solver="remat"),
        Candidate(budget=0.25, note="forecast failed: RuntimeError('" + "x" * 300 + "')", solver="remat"),
    )
    notes = ("region 0: solver not called (unknown)",) + tuple(f"region {i}: solver called" for i in range(1, 7))
    base = dict(budget=0.4, solver="remat", predicted_peak_bytes=int(7.9 * 2**20), baseline_bytes=int(1.7 * 2**20),
                reason="knee of the forecast Pareto front (peak vs FLOPs)", knee=5, chosen=5, candidates=cands,
                notes=notes, checkpoint=(), regional=tuple(f"blocks.{i}" for i in range(12)))
    return _plan(**{**base, **kw})


def test_issue_49_the_plan_table_fits_100_columns_and_shows_no_internal_note() -> None:
    plan = _searched_plan(notes=_searched_plan().notes + (_ALLOCATOR_NOTE,))
    text = plan_table(plan, {"decide_seconds": 5.7, "install_seconds": 1.8},
                      planned="the LightningModule (`self(...)` in training_step)")
    _assert_readable(text)
    assert "7 regions: 6 remat, 1 not partitioned" in text
    # a note that changes the answer is said in words
    assert "not the CUDA caching allocator's rounded blocks" in " ".join(text.split())


def test_issue_49_the_candidates_table_fits_100_columns_and_shows_no_internal_note() -> None:
    plan = _searched_plan()
    for limit in (None, 12 * 2**20):
        text = candidates_table(plan, limit_bytes=limit)
        _assert_readable(text)
        header, rule, *rest = text.splitlines()
        assert header.split() == ["plan", "peak", *(["fits"] if limit else []), "compute", "recomputed", "choice"]
        rows = [line for line in rest if line.startswith(("budget ", "remat "))]
        assert len(rows) == len(plan.candidates)  # one row a plan
    assert "fits" not in candidates_table(plan).splitlines()[0]
    # a row with its phrase's continuation lines, joined
    joined = re.sub(r"\n {20,}", " ", text).splitlines()
    row = {c.label: next(line for line in joined if line.startswith(c.label + "  ")) for c in plan.candidates}
    # 1.70 MiB of baseline + 11 MiB of peak is over 12 MiB, + 8 MiB is not
    assert row["budget 1"].split()[2:6] == ["11.00", "MiB", "no", "+0%"] and "6 regions: default" in row["budget 1"]
    assert row["budget 0.3"].split()[2:6] == ["8.00", "MiB", "yes", "+10%"]
    assert "6 regions: 4 default, 2 solved" in row["budget 0.3"]
    assert "model.decoder.layers.0.self_attention; 6 regions: default" in row["budget 1, 1 ckpt"]
    assert "2 blocks; 12 regions: 8 default, 4 solved" in row["budget 0.3, 2 ckpt"]
    assert row["remat 0.4"].split()[-4:] == ["regions:", "remat", "chosen,", "knee"]
    assert "forecast failed (see plan.candidates)" in row["remat 0.25"]
    # the words used are explained, the CUDA note in words
    assert "  default: torch's fastest choice of what to save" in text and "  remat: whole-graph" in text
    assert "nothing to recompute" not in text
    assert "Caveat (budget 1): the peak counts the bytes the step asks for" in text


def test_the_candidates_table_fits_by_the_limit_and_wraps_a_long_phrase() -> None:
    cands = (Candidate(budget=1.0, peak_bytes=2**20, cost=1e9, note="solver not called (budget_1)"),
             Candidate(budget=0.4, peak_bytes=2**19, cost=1.1e9, note="solver called", solver="remat"),
             Candidate(budget=1.0, checkpoint=("b.0",), note="not a plan: dynamo runs " + ", ".join(
                 f"model.block_{i}" for i in range(12)) + " eagerly under checkpointing"))
    plan = MemPlan(budget=0.4, solver="remat", candidates=cands, knee=1, chosen=1, baseline_bytes=2**20)
    text = candidates_table(plan, limit_bytes=int(1.75 * 2**20))
    _assert_readable(text)
    lines = text.splitlines()
    assert lines[2].split()[:5] == ["budget", "1", "1.00", "MiB", "no"]
    assert lines[3].split()[:5] == ["remat", "0.4", "512.00", "KiB", "yes"]
    assert lines[3].endswith("chosen, knee")
    assert lines[4].startswith("budget 1, 1 ckpt") and " - " in lines[4] and "not a plan: dynamo runs" in lines[4]
    assert lines[5].startswith(" " * 20) and "model.block_" in lines[5]  # the phrase goes on under itself


def test_the_trade_off_names_both_ends_of_the_search() -> None:
    cands = (Candidate(budget=1.0, peak_bytes=4 * 2**20, cost=10.0),
             Candidate(budget=0.5, checkpoint=("b.0",), peak_bytes=3 * 2**20, cost=11.0),
             Candidate(budget=0.1, checkpoint=("b.0", "b.1"), peak_bytes=2**20, cost=15.0))
    assert _plan(candidates=cands, chosen=1).trade_off() == (
        "budget 0.5 with 1 block checkpointed: 3.00 MiB, 25% less than no plan's 4.00 MiB, for +10% estimated "
        "compute; the least memory, budget 0.1 with 2 blocks checkpointed, would be 1.00 MiB, 75% less than no "
        "plan's 4.00 MiB, for +50% estimated compute")
    assert _plan(candidates=cands, chosen=0).trade_off().startswith(
        "no plan (budget 1, nothing recomputed): 4.00 MiB of step peak at the least compute; the least memory")
    assert _plan(candidates=cands, chosen=2).trade_off().endswith("for +50% estimated compute")
    assert "the least memory" not in _plan(candidates=cands, chosen=2).trade_off()
    assert _plan(candidates=cands[1:], chosen=0).trade_off() is None  # no budget-1 plan to compare with
    assert _plan().trade_off() is None  # no search
