"""MemPlanCallback on a CUDA device: single device with inductor, and Lightning's FSDP strategy.

Skipped without CUDA (this machine and CI have none); run on a GPU machine with
``PYTHONPATH=. python -m pytest -s tests/callback/test_cuda.py``. The accuracy bound is the
forecast core's target (5%) with room for the allocator's block rounding on a small model.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_memplan import MemPlanCallback

from .models import TinyNet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _fit(tmp_path: Path, cb: MemPlanCallback, **kw: Any) -> Trainer:
    trainer = Trainer(
        max_epochs=2, callbacks=[cb], logger=CSVLogger(tmp_path), default_root_dir=tmp_path,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
        accelerator="cuda", devices=1, **kw,
    )
    trainer.fit(TinyNet(width=512, depth=4, batch=256, batches=6))
    return trainer


def _last_row(trainer: Trainer) -> dict[str, float]:
    rows = [r for r in csv.DictReader(open(Path(trainer.logger.log_dir) / "metrics.csv")) if r.get("memplan/budget")]
    assert len(rows) == 2  # one per epoch
    return {k: float(v) for k, v in rows[-1].items() if k.startswith("memplan/") and v != ""}


@pytest.mark.parametrize("budget", [1.0, 0.3])
def test_single_device_inductor_forecast_matches_allocator(tmp_path: Path, budget: float) -> None:
    cb = MemPlanCallback(budget, backend="inductor", checkpoint=None, measure_batches=2)
    trainer = _fit(tmp_path, cb)
    assert cb.fallback_reason is None and cb.plan is not None and cb.plan.budget == budget
    row = _last_row(trainer)
    print(f"\ncuda inductor budget {budget}: predicted {row['memplan/predicted_peak_bytes']:.0f} B, "
          f"measured {row['memplan/measured_peak_bytes']:.0f} B, error {row['memplan/prediction_error']:+.2%}")
    assert row["memplan/measured_peak_bytes"] > 0
    assert abs(row["memplan/prediction_error"]) < 0.08


def test_auto_fits_the_device_and_recomputes_nothing_when_the_step_fits(tmp_path: Path) -> None:
    """``MemPlanCallback()`` on a GPU with room to spare: the limit is the device's memory, and the
    fastest plan (budget 1, nothing checkpointed) is installed; the measured reserved memory stays
    under that limit."""
    cb = MemPlanCallback(checkpoint="auto", measure_batches=2)
    _fit(tmp_path, cb)
    plan = cb.plan
    assert cb.fallback_reason is None and plan is not None
    assert plan.budget == 1.0 and not plan.checkpoint and plan.solver != "remat", plan.reason
    assert "cuda:0's memory: " in plan.reason and " free + " in plan.reason, plan.reason
    assert torch.cuda.max_memory_reserved() < torch.cuda.get_device_properties(0).total_memory


def test_remat_plan_under_inductor_on_cuda(tmp_path: Path) -> None:
    cb = MemPlanCallback(0.3, solver="remat", backend="inductor", checkpoint=None, measure_batches=2)
    trainer = _fit(tmp_path, cb)
    assert cb.fallback_reason is None and cb.plan.solver == "remat"
    assert [r.decision.reason for r in cb.forecast.regions] == ["remat"]
    row = _last_row(trainer)
    print(f"\ncuda inductor remat 0.3: predicted {row['memplan/predicted_peak_bytes']:.0f} B, "
          f"measured {row['memplan/measured_peak_bytes']:.0f} B, error {row['memplan/prediction_error']:+.2%}")
    assert abs(row["memplan/prediction_error"]) < 0.08


def test_fsdp_strategy_plans_compiles_and_reports(tmp_path: Path) -> None:
    cb = MemPlanCallback(0.5, backend="inductor", checkpoint=None, measure_batches=2)
    trainer = _fit(tmp_path, cb, strategy="fsdp")
    assert cb.fallback_reason is None, cb.fallback_reason
    assert cb.plan is not None and cb.plan.budget == 0.5
    row = _last_row(trainer)
    print(f"\ncuda fsdp budget 0.5: predicted {row['memplan/predicted_peak_bytes']:.0f} B, "
          f"measured {row['memplan/measured_peak_bytes']:.0f} B, error {row['memplan/prediction_error']:+.2%}")
    assert row["memplan/measured_peak_bytes"] > 0 and row["memplan/predicted_peak_bytes"] > 0
    import torch._functorch.config as fc

    assert fc.activation_memory_budget == 1.0  # restored after fit


@pytest.mark.parametrize("loop", [{"accumulate_grad_batches": 2}, {"precision": "bf16-mixed"}],
                         ids=["accumulate-2", "bf16-mixed"])
def test_cuda_lightning_loops_are_forecast_on_the_allocator(tmp_path: Path, loop: dict[str, Any]) -> None:
    # gradient accumulation replays allocations.accumulation_order through the allocator model
    cb = MemPlanCallback(0.5, backend="inductor", checkpoint=None, measure_batches=4)
    trainer = _fit(tmp_path, cb, **loop)
    assert cb.fallback_reason is None
    row = _last_row(trainer)
    print(f"\ncuda inductor {loop}: predicted {row['memplan/predicted_peak_bytes']:.0f} B, "
          f"measured {row['memplan/measured_peak_bytes']:.0f} B, error {row['memplan/prediction_error']:+.2%}")
    assert abs(row["memplan/prediction_error"]) < 0.08
