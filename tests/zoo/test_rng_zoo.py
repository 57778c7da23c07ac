"""The same seed gives the same losses with ``MemPlanCallback()`` as with a plain
``torch.compile(self.model, backend="aot_eager")``, dropout on: the plan search draws nothing the
training would (its runs are inside a kept generator state), and the compiled step draws as eager
kernels do (dropout is not decomposed into ``rand_like(x) < p``, which consumes the generator
differently)."""
from __future__ import annotations

import warnings

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_memplan import MemPlanCallback

from .zoo_models import ZooModule

pytest.importorskip("transformers")


def _losses(name: str, way: str, plan: bool) -> tuple[list[float], MemPlanCallback | None]:
    seed_everything(0, verbose=False)
    module = ZooModule(name, way)
    cb = MemPlanCallback() if plan else None
    if not plan:
        module.model = torch.compile(module.model, backend="aot_eager")
    trainer = Trainer(max_epochs=1, limit_train_batches=3, accelerator="cpu", devices=1,
                      callbacks=[cb] if cb else [], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return module.losses, cb


@pytest.mark.parametrize(("name", "way"), [("gpt2", "logits")])  # BERT's: test_zoo.py
def test_the_callback_trains_with_the_losses_of_a_plain_compile(name: str, way: str) -> None:
    plain, _ = _losses(name, way, plan=False)
    planned, cb = _losses(name, way, plan=True)
    assert cb is not None and cb.plan is not None and cb.fallback_reason is None
    assert len(plain) == len(planned) == 3
    assert planned == pytest.approx(plain, rel=1e-5, abs=1e-6), (planned, plain, cb.plan)
