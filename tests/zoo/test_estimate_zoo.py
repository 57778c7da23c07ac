"""Meta-device forecasts of models nobody here wrote: each zoo model built under
``torch.device("meta")`` and forecast for ``target="cpu"`` (nothing allocated) gives the forecast
of the same model built for real: the same baseline, the peak within 0.5% (kernel workspaces
computed, or probed on the host when small). A model whose step reads a tensor's value (Lightning's
demo Transformer checks its mask with ``.all()``) is refused with the frame named."""
from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from lightning_memplan import forecast

from .zoo_models import BATCH, ZOO, ZooData

pytest.importorskip("transformers")


class _Step(nn.Module):
    """The model called as ``self.model(**batch).loss`` (Lightning's demo Transformer: its
    log-probabilities' mean), the batch given positionally in ``keys`` order."""

    def __init__(self, model: nn.Module, keys: list[str], demo: bool) -> None:
        super().__init__()
        self.model, self.keys, self.demo = model, keys, demo

    def forward(self, *tensors: torch.Tensor) -> Any:
        if self.demo:
            return self.model(tensors[0], tensors[1]).float().mean()
        return self.model(**dict(zip(self.keys, tensors))).loss


def _step_on(name: str, device: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.optim.Optimizer]:
    build, task = ZOO[name]
    data = ZooData(task)
    batch = {k: torch.stack([data[i][k] for i in range(BATCH)]) for k in data[0]}
    torch.manual_seed(0)
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _Step(build(), list(batch), task == "demo").train()
    return model, tuple(t.to(device) for t in batch.values()), torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize("name", [n for n in ZOO if ZOO[n][1] != "demo"])
def test_meta_forecast_equals_the_real_one(name: str) -> None:
    real, real_inputs, real_opt = _step_on(name, "cpu")
    ref = forecast(real, real_inputs, backend="aot_eager", loss_fn=lambda loss: loss, optimizer=real_opt)
    meta, meta_inputs, meta_opt = _step_on(name, "meta")
    fc = forecast(meta, meta_inputs, backend="aot_eager", loss_fn=lambda loss: loss, optimizer=meta_opt,
                  target="cpu")
    assert ref.status == fc.status == "ok" and ref.peak_bytes and fc.peak_bytes
    assert fc.baseline_bytes == ref.baseline_bytes
    assert abs(fc.peak_bytes - ref.peak_bytes) <= 0.005 * ref.peak_bytes, (fc.peak_bytes, ref.peak_bytes)
    assert not [p for p in fc.problems if "workspaces not known" in p]
    # a CPU forecast says nothing of CUDA's allocator model (GPT-2's stream and timeline differ by
    # the outputs a later backward frees, which only the allocator model on CUDA would read)
    assert not [p for p in (*ref.problems, *fc.problems) if "allocator" in p], ref.problems


def test_meta_forecast_under_inductor_equals_the_real_one() -> None:
    real, real_inputs, real_opt = _step_on("llama_gqa", "cpu")
    ref = forecast(real, real_inputs, backend="inductor", loss_fn=lambda loss: loss, optimizer=real_opt)
    meta, meta_inputs, meta_opt = _step_on("llama_gqa", "meta")
    fc = forecast(meta, meta_inputs, backend="inductor", loss_fn=lambda loss: loss, optimizer=meta_opt,
                  target="cpu")
    assert (fc.peak_bytes, fc.baseline_bytes) == (ref.peak_bytes, ref.baseline_bytes)
    assert [r.method for r in fc.regions] == [r.method for r in ref.regions]


def test_a_step_reading_a_tensor_value_is_refused_naming_the_frame() -> None:
    meta, inputs, opt = _step_on("demo_transformer", "meta")
    with pytest.raises(ValueError, match=r"depends on the values of a tensor at .*transformer.py:\d+ in "
                                         r"forward"):
        forecast(meta, inputs, backend="aot_eager", loss_fn=lambda loss: loss, optimizer=opt, target="cpu")
