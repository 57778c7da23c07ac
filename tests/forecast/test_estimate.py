"""Forecasts that allocate nothing (lightning_memplan.forecasting.estimate): meta-device models and
named targets, on fake tensors. Third-party models are compared with real forecasts in
tests/zoo/test_estimate_zoo.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_memplan import forecast
from lightning_memplan.forecasting.grid import forecast_sweep
from lightning_memplan.measure import PeakWindow
from lightning_memplan.targets import TARGETS


class _Mlp(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def _on(device: str, width: int = 64, depth: int = 3, batch: int = 8) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    with torch.device(device):
        return _Mlp(width, depth).train(), torch.randn(batch, width)


def test_meta_model_forecast_equals_real_without_allocating() -> None:
    real, x = _on("cpu")
    meta, mx = _on("meta")
    ref = forecast(real, (x,), budget=0.5, backend="aot_eager", optimizer=torch.optim.AdamW(real.parameters()))
    fc = forecast(meta, (mx,), budget=0.5, backend="aot_eager", optimizer=torch.optim.AdamW(meta.parameters()),
                  target="cpu")
    assert fc.estimate and fc.target == "cpu" and not ref.estimate
    assert (fc.peak_bytes, fc.baseline_bytes, fc.breakdown) == (ref.peak_bytes, ref.baseline_bytes, ref.breakdown)
    assert [r.saved_bytes for r in fc.regions] == [r.saved_bytes for r in ref.regions]
    # the caller's model and optimizer are left on the meta device, without gradients
    assert all(p.device.type == "meta" and p.grad is None for p in meta.parameters())


def test_large_meta_model_is_forecast_with_little_host_memory() -> None:
    meta, x = _on("meta", width=8192, depth=4, batch=16)  # 4 x 256 MiB of weights, plus AdamW's 2 x
    params = sum(p.numel() * p.element_size() for p in meta.parameters())
    with PeakWindow("cpu") as window:
        fcs = forecast_sweep(meta, (x,), budgets=[1.0, 0.5], optimizer=torch.optim.AdamW(meta.parameters()),
                             target="cpu")
    assert fcs[1.0].baseline_bytes >= 3 * params  # parameters and AdamW's two states
    assert window.peak_bytes < params // 20, window.peak_bytes


def test_named_gpu_target_runs_the_allocator_model() -> None:
    meta, x = _on("meta", batch=32)
    fc = forecast(meta, (x,), backend="aot_eager", optimizer=torch.optim.SGD(meta.parameters(), lr=0.1),
                  target="H100")
    assert fc.target == "H100" and fc.cuda_allocator is not None and fc.cuda_allocator.device == "cuda"
    assert fc.reserved_bytes is not None and fc.reserved_bytes >= fc.cuda_allocator.allocated_max_bytes
    assert fc.peak_bytes == fc.cuda_allocator.allocated_peak_bytes >= fc.requested_peak_bytes
    assert fc.reserved_bytes % (2 * 2**20) == 0  # CUDA's segments: 2 MiB pages for small blocks
    assert TARGETS["H100"].usable_bytes < TARGETS["H100"].memory_bytes


def test_estimate_has_no_step_to_run() -> None:
    meta, x = _on("meta")
    fc = forecast(meta, (x,), backend="aot_eager", target="cpu")
    with pytest.raises(RuntimeError, match=r"estimate for target='cpu'.*no step to train"):
        fc.step()


def test_real_model_with_a_target_is_not_touched() -> None:
    real, x = _on("cpu")
    before = [p.detach().clone() for p in real.parameters()]
    fc = forecast(real, (x,), backend="aot_eager", target="cpu", optimizer=torch.optim.AdamW(real.parameters()))
    assert fc.estimate and fc.peak_bytes == forecast(real, (x,), backend="aot_eager",
                                                     optimizer=torch.optim.AdamW(real.parameters())).peak_bytes
    assert all(torch.equal(a, b) for a, b in zip(before, real.parameters()))


def test_meta_model_without_target_is_refused_before_tracing() -> None:
    meta, x = _on("meta")
    with pytest.raises(ValueError, match=r"`forecast\(target=None\)`: the model or its inputs are on the meta "
                                         r"device.*target='cpu', 'cuda', or a GPU such as.*'H100'"):
        forecast(meta, (x,), backend="aot_eager")
    with pytest.raises(ValueError, match=r"`forecast_sweep\(target=None\)`"):
        forecast_sweep(meta, (x,), budgets=[1.0])


@pytest.mark.parametrize("target", ["H1000", "", 3])
def test_unknown_target_is_refused(target: object) -> None:
    meta, x = _on("meta")
    with pytest.raises(ValueError, match=rf"`forecast\(target={target!r}\)` is not a known device. Expected one "
                                         r"of 'cpu', 'cuda', 'T4'"):
        forecast(meta, (x,), backend="aot_eager", target=target)  # type: ignore[arg-type]


def test_target_names_are_case_insensitive() -> None:
    meta, x = _on("meta")
    assert forecast(meta, (x,), backend="aot_eager", target="h100").target == "H100"


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.mean() > 0:  # a value, not a shape
            return F.relu(h)
        return h


def test_data_dependent_branch_names_the_frame() -> None:
    with torch.device("meta"):
        model, x = _Branchy(), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"depends on the values of a tensor at .*test_estimate.py:\d+ in forward"):
        forecast(model, (x,), backend="aot_eager", target="cpu")
