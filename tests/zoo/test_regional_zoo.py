"""Regional compilation of a model nobody here wrote, as the callback compiles it.

GPT-2 drops its embeddings out in the frame that loops over its blocks (eager code between the
compiled regions) and hands every block the causal mask an earlier region made; the graph all
blocks share saves its hidden input, which is the dropout's output for the first block and the
block before's for the others."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_memplan import MemPlanCallback

from .test_zoo import _errors, _fit
from .zoo_models import ZooModule

pytest.importorskip("transformers")


def test_gpt2_compiled_block_by_block_is_forecast_as_measured(tmp_path: Path) -> None:
    """Budget 1, ``regional=True``: each epoch within 0.5% (the block's input was judged by the
    first block's call alone and its outputs let die after the next block's forward: -1.45%)."""
    torch.manual_seed(0)
    cb = MemPlanCallback(budget=1.0, regional=True, backend="aot_eager", verbose=False, log_plots=False)
    trainer = _fit(tmp_path, ZooModule("gpt2", "loss"), [cb])
    assert cb.plan is not None and cb.fallback_reason is None
    assert cb.plan.regional, cb.plan
    errors = _errors(trainer)
    assert len(errors) == 2 and all(abs(e) < 0.005 for e in errors), errors
