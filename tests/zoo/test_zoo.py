"""Third-party models, planned with default arguments (aot_eager on CPU), forecast within 3% of
the measured peak in every epoch, in the ways users write training_step (tests/zoo/zoo_models.py)."""
from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_memplan import MemPlanCallback

from .zoo_models import ZOO, ZooModule

pytest.importorskip("transformers")

CASES = [(name, way) for name, (_, task) in ZOO.items() for way in ("loss", "logits", "self")
         if not (task == "demo" and way == "loss")]


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
    budget = "auto" if way == "loss" or ZOO[name][1] == "demo" else 0.5  # the default where CI time allows
    cb = MemPlanCallback(budget, backend="aot_eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, module, [cb])
    said = [str(w.message) for w in seen if "MemPlan" in str(w.message)]
    assert cb.plan is not None and cb.fallback_reason is None, said
    assert cb._fit.planned.startswith("`model`") or way == "self", cb._fit.planned
    errors = _errors(trainer)
    assert len(errors) == 2, said
    assert all(abs(e) < 0.03 for e in errors), (errors, cb.plan, said)
