"""A region's outputs that a later region's backward holds last die inside that backward
(forecasting.layout.lay_out's ``early``, measured by MemplanBackend.early_frees on a steady run)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lightning_memplan import forecast, measure_peak
from lightning_memplan.forecasting.layout import lay_out, run_order
from lightning_memplan.forecasting.regions import RegionPlan


class LossInside(nn.Module):
    """Hugging Face's ``model(ids, labels=ids)`` in small: the logits, a graph break, and the loss
    computed from them in a region of its own, which saves the logits to recompute its
    log-softmax in backward."""

    def __init__(self, classes: int = 4000) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.body(x))
        torch._dynamo.graph_break()
        return logits, F.cross_entropy(logits, y)


def test_logits_die_in_the_loss_regions_backward() -> None:
    """Held until the logits' own region's backward, they were counted beside the loss region's
    backward temporaries: +21.4% on benchmarks/eager_loss.py's in_model row, +29.7% on a tiny
    Hugging Face GPT-2 (forecast against measure_peak of the same compiled step)."""
    torch.manual_seed(0)
    model = LossInside()
    x, y = torch.randn(256, 64), torch.arange(256) % 4000
    fc = forecast(model, (x, y), budget=0.5, backend="aot_eager", loss_fn=lambda out: out[1])
    assert len(fc.regions) >= 2
    (consumer, freed), = fc._parts.early.items()
    logits = 256 * 4000 * 4
    assert freed == {consumer - 1: logits}
    fc.step()
    measured = measure_peak(fc.step)
    assert abs(fc.peak_bytes / measured - 1) < 0.01, (fc.peak_bytes, measured)
    # without it, the logits are counted through the loss region's backward
    parts = fc._parts
    _, held, _ = lay_out(run_order(parts.plans, parts.executions), parts.optimizer)
    assert held >= measured + 0.9 * logits


def _plan(index: int, *, retained: int, saved: int, bw: tuple[int, ...], last_use: int | None) -> RegionPlan:
    return RegionPlan(index=index, method="fx", fw_nodes=("f",), fw_timeline=(retained,), fw_retained=retained,
                 saved=saved, bw_nodes=tuple(f"b{k}" for k in range(len(bw))), bw_timeline=bw, bw_end=0,
                 bw_peak=max(bw), bw_grads_at_peak=0, gradients=0, tangents=0, tangents_in_timeline=True,
                 grad_copy=0, input_last_use=last_use)


def test_layout_frees_the_outputs_after_the_last_read_of_the_activation_inputs() -> None:
    # region 0 returns 1000 B (not saved by itself); region 1 saves them, reads them last at step 1,
    # then makes 500 B of temporaries
    plans = [_plan(0, retained=1000, saved=0, bw=(0, 0), last_use=None),
             _plan(1, retained=10, saved=10, bw=(10, 10, 510, 0), last_use=1)]
    timeline, peak, _ = lay_out(plans, None)
    assert peak == 1000 + 510
    timeline, peak, _ = lay_out(plans, None, early={1: {0: 1000}})
    assert peak == 1000 + 10  # the 500 B come after the outputs died
    assert [t.bytes for t in timeline if t.region == 0 and t.phase == "backward"] == [0, 0]
    # no later read known: they die at the end of that backward (the peak inside stands)
    late = [plans[0], _plan(1, retained=10, saved=10, bw=(10, 10, 510, 0), last_use=None)]
    _, peak, _ = lay_out(late, None, early={1: {0: 1000}})
    assert peak == 1000 + 510
