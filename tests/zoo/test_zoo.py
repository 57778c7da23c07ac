"""Third-party models, planned with default arguments (aot_eager on CPU), forecast within 3% of
the measured peak in every epoch, in the ways users write training_step (tests/zoo/zoo_models.py)."""
from __future__ import annotations

import csv
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lightning_memplan import MemPlanCallback
from lightning_memplan.planner.checkpointing import repeated_blocks

from .zoo_models import ZOO, ZooData, ZooModule

pytest.importorskip("transformers")

# CI runs every way on two models and one way on the rest (benchmarks/zoo.py runs them all)
_EVERY_WAY = ("llama_gqa", "bert_mlm")
_ONE_WAY = {"llama": "loss", "qwen2": "logits", "gpt2": "self", "bert_cls": "loss", "vit": "self", "resnet": "logits",
            "convnext": "self", "demo_transformer": "logits", "opt": "loss", "phi": "logits"}
#: Misses not fixed yet, each with its mechanism; strict: a fix makes the test fail until this is updated.
#: (Lightning's demo Transformer, nll_loss in training_step, is still forecast +6.3% at an explicit
#: budget 1.0, whole module, where forecast() of the compiled step alone is exact; the default
#: search now installs whole-graph remat at 0.25 for it, forecast exactly.)
_KNOWN: dict[tuple[str, str], str] = {}
CASES = [pytest.param(name, way, marks=[pytest.mark.xfail(strict=True, raises=AssertionError,
                                                               reason=_KNOWN[(name, way)])]
                      if (name, way) in _KNOWN else [])
         for name in ZOO for way in ("loss", "logits", "self")
         if (name in _EVERY_WAY or _ONE_WAY.get(name) == way) and not (ZOO[name][1] == "demo" and way == "loss")]


def _fit(tmp_path: Path, module: ZooModule, callbacks: list[object], epochs: int = 2) -> Trainer:
    trainer = Trainer(max_epochs=epochs, accelerator="cpu", devices=1, callbacks=callbacks,  # type: ignore[arg-type]
                      logger=CSVLogger(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=0)
    trainer.fit(module)
    return trainer


def _errors(trainer: Trainer) -> list[float]:
    path = Path(trainer.logger.log_dir) / "metrics.csv"  # type: ignore[union-attr]
    with path.open() as f:
        return [float(r["memplan/prediction_error"]) for r in csv.DictReader(f) if r.get("memplan/prediction_error")]


@pytest.mark.parametrize(("name", "way"), CASES)
def test_zoo_model_is_planned_and_forecast_within_3_percent(tmp_path: Path, name: str, way: str) -> None:
    torch.manual_seed(0)
    module = ZooModule(name, way)
    cb = MemPlanCallback(backend="aot_eager")  # every other argument its default: budget "auto"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, module, [cb])
    said = [str(w.message) for w in seen if "MemPlan" in str(w.message)]
    assert cb.plan is not None and cb.fallback_reason is None, said
    assert cb._fit.planned.startswith("`model`") or way == "self", cb._fit.planned
    assert cb.plan.regional, cb.plan  # the search compiles the repeated layers each on its own
    errors = _errors(trainer)
    assert len(errors) == 2, said
    assert all(abs(e) < 0.03 for e in errors), (errors, cb.plan, said)


@pytest.mark.parametrize(("name", "layers"), [("llama_gqa", 1), ("gpt2", 2), ("bert_mlm", 1)])
def test_outputs_the_step_never_reads_are_timed_as_the_users_forward_holds_them_under_inductor(
        tmp_path: Path, name: str, layers: int) -> None:
    """``.loss`` from ``labels=``: the output object also holds the logits (and the KV cache).

    - Llama (grouped-query attention): the user's compiled forward returns the cache, so its keys and
      values live to the end of the forward; in the forecast's graph the stand-in loss summed each,
      and inductor scheduled each sum right after its tensor and freed it early (4.6% low). One sum
      over all the outputs (an extern kernel after the last of them) keeps them.
    - GPT-2: dynamo compiles the loss as a region of its own, and the cache goes from the model's
      region straight to the eager code, which drops it with the output object. It is no tensor its
      region saved, so the forecast held it as that region's outputs and counted it again in the
      eager code (+11.9%); it now dies there.
    - BERT (masked LM): the step never reads ``.logits``, so autograd hands the backward a tensor of
      zeros of their size, live beside the logits' gradient until the kernel that adds it in; and
      that gradient is a new buffer, since the saved logits are the user's output, which
      AOTAutograd never donates to the backward (the forecast's graph, where the stand-in loss reads
      them, had computed it in place): 2.1% low without both.

    Depths: the least at which each mechanism shows (the commit before each fix, one layer: Llama
    -23%, BERT -6.4%; GPT-2's shows from two layers, +11.9%; one layer +0.0%)."""
    torch.manual_seed(0)
    cb = MemPlanCallback(0.5, backend="inductor")
    trainer = _fit(tmp_path, ZooModule(name, "loss", layers=layers), [cb], epochs=1)
    assert cb.plan is not None and cb.fallback_reason is None and cb.plan.backend == "inductor"
    (error,) = _errors(trainer)
    assert abs(error) < 0.01, error


def test_a_graph_break_inside_torch_nn_leaves_no_layer_eager(tmp_path: Path) -> None:
    """Lightning's demo Transformer: dynamo breaks the graph inside ``nn.Transformer`` (``.item()`` in
    ``_detect_is_causal_mask``). dynamo does not compile torch.nn's frames on their own, so without
    resuming in the nested frame the whole encoder-decoder ran eagerly (forecast 87% low, warned);
    resumed there, every layer is in a compiled graph: nothing is warned and the forecast holds."""
    torch.manual_seed(0)
    cb = MemPlanCallback(0.5, backend="aot_eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, ZooModule("demo_transformer", "logits"), [cb], epochs=1)
    assert not [w for w in seen if "outside every compiled graph" in str(w.message)]
    assert cb.fallback_reason is None
    assert torch._dynamo.config.nested_graph_breaks is False  # scoped to the compiled calls
    (error,) = _errors(trainer)
    assert abs(error) < 0.01, error


def test_planning_leaves_the_losses_as_a_plain_compile_gives_them(tmp_path: Path) -> None:
    """BERT with dropout on, same seed and data: the losses with the callback (a search on the first
    batch, then its plan compiled) equal those of the same model compiled by the user with a plain
    ``torch.compile(backend="aot_eager")``, the first exactly: the search draws nothing from the
    generators the user's step draws from, and the compiled step keeps dropout undecomposed, so it
    draws its masks as eager code does (decomposed into ``rand_like(x) < p`` it drew them otherwise:
    6.2194 where eager and a plain compile give 6.2059)."""
    losses = []
    for planned in (False, True):
        torch.manual_seed(0)
        module = ZooModule("bert_mlm", "loss")
        if not planned:
            module.model = torch.compile(module.model, backend="aot_eager", dynamic=False)
        _fit(tmp_path, module, [MemPlanCallback(backend="aot_eager")] if planned else [], epochs=1)
        losses.append(module.losses)
    plain, with_plan = losses
    assert len(plain) == len(with_plan) == 3
    assert plain[0] == with_plan[0], (plain, with_plan)
    assert max(abs(a - b) for a, b in zip(plain, with_plan)) < 1e-4, (plain, with_plan)


class _Logits(torch.nn.Module):
    """A transformers LM as ``forecast()`` takes a model: token ids in, logits out."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("name", ["llama_gqa", "bert_mlm"])
def test_a_remat_plan_of_a_real_model_is_forecast_as_measured(name: str) -> None:
    """``forecast(solver="remat")`` on transformers' models, the outputs summed (its default loss):
    the sum's gradient reaches the LM head's backward ``mm`` as an expand (stride 0), which the
    kernel copies to a contiguous matrix first; at budget 0.55 that copy is the step's peak (Llama
    9.4% low, BERT 6% low without it). Dropout off: the step is the same each call."""
    from lightning_memplan import forecast, measure_peak

    torch.manual_seed(0)
    lm = ZOO[name][0]()
    for m in lm.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = _Logits(lm).train()
    fc = forecast(model, (torch.randint(0, 512, (4, 32)),), budget=0.55, solver="remat", backend="aot_eager")
    assert fc.status == "ok", fc.problems
    fc.step()
    measured = measure_peak(fc.step)
    assert abs(fc.peak_bytes - measured) <= 0.01 * measured, (fc.peak_bytes, measured)


@pytest.mark.parametrize(("name", "way", "shared", "budget"),
                         [("bert_mlm", "logits", True, "auto"), ("llama_gqa", "loss", False, "auto"),
                          ("gpt2", "logits", False, "auto")])
def test_a_regional_plan_of_a_real_model_compiles_each_layer_on_its_own_and_is_forecast_within_3_percent(
        tmp_path: Path, name: str, way: str, shared: bool, budget: float | str) -> None:
    """``regional=True``: the layers are compiled each on its own and forecast as measured. BERT's
    layers share one graph (the search partitions it once, whatever the depth); Llama's read their
    ``layer_idx`` (the KV cache's index), so each compiles a graph of its own, and its embedding and
    rotary table, called beside them in the frame that loops (which dynamo runs eagerly), compile on
    their own (without: 2.6% low). The search traces Llama's checkpoint sets with the layers really
    wrapped (their attention sets a context variable: the emulation is not used), and they compile
    (tests/zoo/test_checkpoint_zoo.py). GPT-2's
    embeddings are summed and dropped out in the frame that loops, eagerly: their outputs die there,
    the sum and dropout's mask live on, and the KV cache dies with the output object before the
    loss (without: 7.9% high)."""
    torch.manual_seed(0)
    module = ZooModule(name, way)
    cb = MemPlanCallback(budget, backend="aot_eager", regional=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, module, [cb])
    said = [str(w.message) for w in seen if "MemPlan" in str(w.message)]
    assert cb.plan is not None and cb.fallback_reason is None, said
    layers = len(repeated_blocks(module.model))
    assert layers >= 2 and set(repeated_blocks(module.model)) <= set(cb.plan.regional), cb.plan
    fc = cb._fit.plans.forecast if cb._fit.plans is not None else None
    assert fc is not None and fc.status == "ok", said
    calls = [r.calls for r in fc.regions]
    # shared: one region called once per layer, when the plan treats every layer alike (a plan that
    # checkpoints some of them compiles those apart); else a region per layer, besides the stem's and head's
    alike = len(set(cb.plan.checkpoint) & set(repeated_blocks(module.model))) in (0, layers)
    assert (max(calls) == layers) if shared and alike else (len(calls) >= layers + 2 or not alike), (calls, cb.plan)
    assert not [w for w in seen if "outside every compiled graph" in str(w.message)], said
    assert not [w for w in seen if "under activation checkpointing" in str(w.message)], said
    errors = _errors(trainer)
    assert len(errors) == 2 and all(abs(e) <= 0.03 for e in errors), (errors, said)


def test_checkpoint_sets_of_a_real_models_regional_layers_are_forecast_from_one_trace_as_really_wrapped(
        emulated_as_wrapped: Callable[..., Any]) -> None:
    """BERT (masked LM), its layers compiled each on its own and sharing one graph: the grid's one
    trace forecasts the second layer, and both layers, checkpointed exactly as a trace with those
    layers really wrapped does (peak and FLOPs). Dropout off: the step is the same each call."""
    torch.manual_seed(0)
    lm = ZOO["bert_mlm"][0]()
    for m in lm.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = _Logits(lm).train()
    layers = tuple(f"lm.{b}" for b in repeated_blocks(lm))
    assert len(layers) == 2, layers
    grid = emulated_as_wrapped(model, (torch.randint(0, 512, (4, 32)),), [layers[1:], layers], (1.0, 0.3), layers)
    assert grid[(layers, 1.0)].peak_bytes < grid[((), 1.0)].peak_bytes


def test_outputs_the_frame_that_loops_drops_die_there_in_a_regional_forecast() -> None:
    """GPT-2 compiled regionally (``forecast(regional=...)``): its embeddings' outputs are summed in
    the frame that loops over the blocks (which dynamo runs eagerly) and die there, not at their own
    backwards (held to them, the forecast was 2.35%, 40,960 B, high); the sum, dropped out, is the
    first block's input, and dropout saves its mask: autograd holds both to their backwards (left
    out, the forecast was 3.9%, 65,540 B, low)."""
    from lightning_memplan import forecast, measure_peak
    from lightning_memplan.planner.regional import regional_blocks

    torch.manual_seed(0)
    model = _Logits(ZOO["gpt2"][0]()).train()
    names = regional_blocks(model, True)
    assert {"lm.transformer.wte", "lm.transformer.wpe"} <= set(names), names
    fc = forecast(model, (torch.randint(0, 512, (4, 32)),), budget=0.5, backend="aot_eager", regional=names)
    assert fc.status == "ok", fc.problems
    assert fc._parts is not None and any(fc._parts.forward_freed.values()) and any(fc._parts.glue), fc._parts
    fc.step()
    measured = measure_peak(fc.step)
    assert abs(fc.peak_bytes - measured) <= 0.005 * measured, (fc.peak_bytes, measured)


class _AtBatch(ZooModule):
    """A zoo module at batch 32 (at the zoo's 4 the step's peak lies where the loss adds nothing)."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(ZooData(self.task, n=5 * 32), batch_size=32)


@pytest.mark.parametrize("name", ["llama", "bert_mlm"])
def test_plan_memory_of_a_model_that_computes_its_own_loss_predicts_the_fit(tmp_path: Path, name: str) -> None:
    """``self.model(**batch).loss``: the loss is one of the forward's outputs. plan_memory's run of
    ``training_step`` (the forward without autograd) still measures the step's eager part: the
    logits' zero gradient the compiled backward is passed beside the loss's (its outputs are made
    the outputs of one autograd node, as a compiled region's). Before, the loss was a leaf without a
    graph, the run was dropped and the plan forecast the forward alone: 1.5 MB (9.4%) low on llama at
    batch 32, 4.96 MB (18%) at 85, so the batch-size search took a batch that did not fit."""
    from lightning_memplan.tuner import plan_memory

    torch.manual_seed(0)
    module = _AtBatch(name, "loss")
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    plan = plan_memory(trainer, module, candidate_budgets=(1.0,), checkpoint=None, remat_budgets=(), regional=True,
                       backend="aot_eager")  # one candidate, layers compiled each on their own, as by default
    assert plan.regional, plan
    cb = MemPlanCallback(plan=plan, backend="aot_eager", log_plots=False, verbose=False)
    _fit(tmp_path, module, [cb], epochs=1)
    assert cb.fallback_reason is None and cb.measured[0], (cb.fallback_reason, cb.measured)
    measured = max(cb.measured[0])
    assert plan.predicted_peak_bytes == pytest.approx(measured, rel=0.005), (plan.predicted_peak_bytes, measured)
    assert plan.predicted_peak_bytes == pytest.approx(cb.plan.predicted_peak_bytes, rel=0.001)
