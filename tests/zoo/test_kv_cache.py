"""Transformers' key/value cache is off while the callback trains a module that has one, and put
back after fit (lightning_memplan.planner.kv_cache): a training step never reads it."""
from __future__ import annotations

import warnings

import pytest
import torch
from lightning.pytorch import Trainer

from lightning_memplan import MemPlanCallback
from lightning_memplan.planner.kv_cache import cache_configs, cache_off_patches

from .zoo_models import ZooModule

pytest.importorskip("transformers")


class _Watched(ZooModule):
    """Notes ``use_cache`` of the model's config at every training step."""

    def __init__(self) -> None:
        super().__init__("llama_gqa", "loss")
        self.seen: list[bool] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append(self.model.config.use_cache)
        return super().training_step(batch, batch_idx)


def test_cache_configs_finds_each_config_once() -> None:
    module = ZooModule("llama_gqa", "loss")
    assert cache_configs(module) == [module.model.config]  # the causal LM and its base share one config
    assert cache_off_patches(module) == [(module.model.config, "use_cache", False)]
    module.model.config.use_cache = False
    assert cache_configs(module) == []
    assert cache_configs(ZooModule("vit", "loss")) == []  # no cache to turn off


def test_the_fit_trains_without_the_cache_and_puts_it_back(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    module = _Watched()
    assert module.model.config.use_cache is True
    trainer = Trainer(max_epochs=1, limit_train_batches=2, accelerator="cpu", devices=1, callbacks=[MemPlanCallback()],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(), caplog.at_level("INFO"):
        warnings.simplefilter("ignore")
        trainer.fit(module)
    assert module.seen == [False, False]
    assert module.model.config.use_cache is True
    assert caplog.text.count("transformers' key/value cache is off for this fit") == 1
