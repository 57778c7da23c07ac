"""Block checkpointing of models nobody here wrote is a compiled plan.

transformers' attention classes (``@use_kernelized_func``, from the ``kernels`` package
transformers requires) set and reset a context variable on every call. Under
``torch.utils.checkpoint`` dynamo refuses a forward that mutates a Python object and runs the block
eagerly, outside every graph, unless ``skip_fwd_side_effects_in_bwd_under_checkpoint`` is set: our
compiled calls set it (scoped to each call), so checkpointing a Llama, Qwen2 or Phi layer is a plan
that the search can choose and the forecast sees."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from lightning_memplan import MemPlanCallback
from lightning_memplan.forecasting.grid import forecast_sweep
from lightning_memplan.measure import measure_peak
from lightning_memplan.planner.checkpointing import checkpointed, repeated_blocks, uncompiled_blocks
from lightning_memplan.planner.search import NOT_A_PLAN

from .test_estimate_zoo import _step_on
from .test_zoo import _errors, _fit
from .zoo_models import ZooModule

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["llama", "qwen2", "phi"])
def test_checkpointed_layers_of_a_transformers_model_are_compiled_and_forecast_as_measured(name: str) -> None:
    """Every layer checkpointed, each compiled on its own: no layer runs eagerly (before: every one
    did, the forecast missed their activations and the search called the set no plan), the peak
    is below the unplanned step's, and a real step measures what was forecast."""
    model, inputs, opt = _step_on(name, "cpu")
    layers = repeated_blocks(model)
    assert len(layers) >= 2, layers
    kwargs = {"loss_fn": lambda loss: loss, "optimizer": opt, "regional": layers}
    plain = forecast_sweep(model, inputs, budgets=(1.0,), **kwargs)[1.0]
    with checkpointed(model, layers):
        fc = forecast_sweep(model, inputs, budgets=(1.0,), **kwargs)[1.0]
        assert fc.status == "ok", fc.problems
        assert uncompiled_blocks(model, layers, fc.compiled_parameter_ids) == []
        fc.step()  # warm: the optimizer's state exists from here on, as at the forecast's steady state
        measured = measure_peak(fc.step)
    assert fc.peak_bytes is not None and plain.peak_bytes is not None
    assert fc.peak_bytes < 0.8 * plain.peak_bytes, (fc.peak_bytes, plain.peak_bytes)
    assert abs(fc.peak_bytes - measured) <= 0.005 * measured, (fc.peak_bytes, measured)
    assert torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint is False  # scoped to the calls


def test_the_search_plans_a_llama_with_its_layers_checkpointed_and_the_fit_measures_it(tmp_path: Path) -> None:
    """``max_memory`` below every plan without checkpointing: the callback installs one with layers
    checkpointed (before: every such candidate was "not a plan", nothing fitted, and the smallest
    budget-only plan trained over the limit), and each epoch's measured peak is the forecast's."""
    torch.manual_seed(0)
    probe = MemPlanCallback(backend="aot_eager", verbose=False, log_plots=False)
    _fit(tmp_path / "probe", ZooModule("llama", "loss"), [probe], epochs=1)
    assert probe.plan is not None and probe.plan.baseline_bytes is not None
    cands = probe.plan.candidates
    assert not [c for c in cands if c.note.startswith(NOT_A_PLAN)], [c.note for c in cands]
    unckpt = min(c.peak_bytes for c in cands if not c.checkpoint and c.peak_bytes is not None)
    ckpt = min(c.peak_bytes for c in cands if c.checkpoint and c.peak_bytes is not None)
    assert ckpt < unckpt
    limit = probe.plan.baseline_bytes + (ckpt + unckpt) // 2
    torch.manual_seed(0)
    cb = MemPlanCallback(backend="aot_eager", max_memory=limit, verbose=False, log_plots=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path / "fit", ZooModule("llama", "loss"), [cb])
    said = [str(w.message) for w in seen if "MemPlan" in str(w.message)]
    assert cb.plan is not None and cb.fallback_reason is None, said
    assert cb.plan.checkpoint, cb.plan
    errors = _errors(trainer)
    assert len(errors) == 2 and all(abs(e) < 0.01 for e in errors), (errors, said)


@pytest.mark.parametrize(("name", "way"), [("llama_gqa", "loss"), ("phi", "loss"), ("gpt2", "logits")])
def test_a_model_that_checkpoints_its_own_layers_is_forecast_as_measured(tmp_path: Path, name: str, way: str) -> None:
    """``self.model.gradient_checkpointing_enable()``, transformers' own checkpointing, and
    ``MemPlanCallback()`` with default arguments: each epoch within 1%. Llama's and Phi's layers
    were run eagerly by dynamo under that checkpointing (their attention sets a context variable),
    outside every graph, and forecast +157% / +136% (the callback saw no checkpointing at all);
    GPT-2's layers mutate nothing and were exact already."""
    torch.manual_seed(0)
    module = ZooModule(name, way)
    module.model.gradient_checkpointing_enable()
    cb = MemPlanCallback(backend="aot_eager", verbose=False, log_plots=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, module, [cb])
    said = [str(w.message) for w in seen if "MemPlan" in str(w.message)]
    assert cb.plan is not None and cb.fallback_reason is None, said
    errors = _errors(trainer)
    assert len(errors) == 2 and all(abs(e) < 0.01 for e in errors), (errors, cb.plan, said)
