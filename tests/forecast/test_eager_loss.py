"""The eager loss between the compiled forward and its backward: measured on a real step, laid into
the forecast (lightning_memplan.forecasting.eager_loss, Forecast.with_eager_loss)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge

from lightning_memplan import forecast
from lightning_memplan._torch.storages import storage_key
from lightning_memplan.callback.first_batch import held_returned
from lightning_memplan.forecasting.autograd_walk import parameters_reached
from lightning_memplan.forecasting.eager_loss import (
    EagerCalls,
    EagerLoss,
    NotedOutputs,
    eager_loss_events,
    measure_eager_loss,
    measure_eager_losses,
    scaled_eager_loss,
)


def _compiled_head(classes: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, classes))
    x = torch.randn(64, 16)
    out = torch.compile(model, backend="aot_eager", dynamic=False)(x)
    return model, x, out


def test_cross_entropy_keeps_its_log_softmax_and_hands_over_the_logits_gradient() -> None:
    model, _, logits = _compiled_head(1000)
    nbytes = 64 * 1000 * 4
    edges = [get_gradient_edge(logits)]
    target = torch.arange(64) % 1000
    loss = F.cross_entropy(logits, target)
    del logits  # training_step returned: only the loss's graph holds anything now
    m = measure_eager_loss(loss, edges, outputs_bytes=nbytes, live_outputs={}, exclude=[*model.parameters(), target])
    assert m.outputs_bytes == nbytes and m.outputs_kept_bytes == 0
    assert nbytes <= m.kept_bytes <= nbytes + 16  # the log-softmax (and nll's scalars)
    assert m.output_grad_bytes == nbytes
    assert 2 * nbytes <= m.backward_peak_bytes <= 2 * nbytes + 16  # nll's gradient, then log-softmax's
    loss.backward()  # the real backward still runs (retain_graph), once
    assert all(p.grad is not None for p in model.parameters())


def test_mse_keeps_the_output_itself() -> None:
    model, _, out = _compiled_head(8)
    nbytes = 64 * 8 * 4
    edges = [get_gradient_edge(out)]
    target = torch.zeros(64, 8)
    loss = F.mse_loss(out, target)
    live = {storage_key(out): nbytes}
    m = measure_eager_loss(loss, edges, outputs_bytes=nbytes, live_outputs=live, alive_outputs=[out],
                           exclude=[*model.parameters(), target])
    assert (m.outputs_kept_bytes, m.kept_bytes, m.output_grad_bytes) == (nbytes, 0, nbytes)
    # mse's node saved it: it dies as the loss's backward runs, before the compiled backward
    # (Lightning's demo Transformer: the log-probabilities F.nll_loss keeps, counted live through
    # the compiled backward, made the forecast +3.1%), unless training_step returned it
    assert m.saved_outputs == ((storage_key(out), nbytes),)
    events = eager_loss_events(m, 0)
    assert ("eager_loss_backward_end", "activations", -m.backward_peak_bytes - nbytes) in events[("bw", 0, "before")]
    assert events[("bw", 0, "after")] == [("eager_outputs_freed_after_backward", "activations", 0)]
    (returned,) = held_returned((m,), {"loss": loss, "out": out.detach()})
    assert returned.saved_outputs == () and eager_loss_events(returned, 0)[("bw", 0, "after")][0][2] == -nbytes


def test_outputs_freed_in_the_eager_code_are_freed_in_its_measured_peak() -> None:
    """``self.model(x).logits``: the output object is a temporary, so its other tensors (a KV
    cache) die before the loss is computed. They were made before the window on the eager code
    opened, and the CPU profiler records no free of such a block: counted live, the peak was their
    bytes too high (GPT-2 and Qwen2 returning their caches: +8.6%, +5.2%). Each output storage's
    death is now timed (its last tensor's) and merged into the window."""
    model, _, logits = _compiled_head(1000)
    cache = torch.randn(64, 4000, requires_grad=True) * 1  # an output the step does not use
    target = torch.arange(64) % 1000
    calls = EagerCalls("cpu")
    calls.returned({"logits": logits, "cache": cache})
    out_bytes = 64 * 1000 * 4 + 64 * 4000 * 4
    del cache  # the temporary output object dies: only its logits are taken
    loss = F.cross_entropy(logits, target)  # its log-softmax (256 KB) is made after the cache is gone
    calls.close()
    (note,) = calls.calls
    assert note.forward_peak_measured
    assert note.forward_peak_bytes < 64 * 1000 * 4 // 2, note.forward_peak_bytes  # not 256 KB above
    del logits
    (m,) = measure_eager_losses(loss, [note.now()], exclude=[*model.parameters(), target])
    assert m.forward_peak_measured and m.outputs_bytes == out_bytes and m.outputs_kept_bytes == 0
    # laid in: the peak is the outputs as they were returned (the cache gone before the log-softmax)
    (top, *rest) = eager_loss_events(m, 0)[("fw", 0, "after")]
    assert top == ("eager_loss_forward", "activations", out_bytes + m.forward_peak_bytes)
    # unmeasured, the outputs are taken to live while the loss's kept tensors are made
    unmeasured = dataclasses.replace(m, forward_peak_bytes=0, forward_peak_measured=False)
    assert eager_loss_events(unmeasured, 0)[("fw", 0, "after")][0][2] == out_bytes + m.kept_bytes


def test_a_loss_without_the_outputs_is_refused() -> None:
    _, _, out = _compiled_head(4)
    edges = [get_gradient_edge(out)]
    w = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match="does not depend on the compiled forward's outputs"):
        measure_eager_loss((w * 2).sum(), edges, outputs_bytes=0)
    with pytest.raises(ValueError, match="no autograd graph"):
        measure_eager_loss(torch.tensor(1.0), edges, outputs_bytes=0)


def test_parameters_only_the_eager_code_reads_have_their_gradients_counted() -> None:
    """An eager head (and a learnable temperature) on the compiled model's outputs: their
    gradients are made by the loss's backward; the compiled model's parameters are not reached
    (the walk stops at its outputs), and ``forecast_params`` leaves out one read by both."""
    model, _, feats = _compiled_head(32)
    head, temperature = nn.Linear(32, 1000), nn.Parameter(torch.ones(()))
    target = torch.arange(64) % 1000
    loss = F.cross_entropy(head(feats) / temperature, target)
    call = NotedOutputs.of(feats)
    del feats
    baseline = [*model.parameters(), *head.parameters(), temperature, target]
    (m,) = measure_eager_losses(loss, [call.now()], exclude=baseline)
    head_bytes = (32 * 1000 + 1000) * 4
    assert m.param_grad_bytes == head_bytes + 4
    (m,) = measure_eager_losses(loss, [call.now()], exclude=baseline, forecast_params=[head.weight])
    assert m.param_grad_bytes == 1000 * 4 + 4
    # laid in: made at the end of the loss's backward, in the gradients, never freed in the step
    events = eager_loss_events(m, 0)
    assert ("eager_parameter_gradients", "gradients", m.param_grad_bytes) in events[("bw", 0, "before")]
    assert sum(d for evs in events.values() for _, _, d in evs) == m.param_grad_bytes
    loss.backward()
    assert head.weight.grad is not None and temperature.grad is not None


def test_events_and_the_forecast_laid_out_with_them() -> None:
    loss = EagerLoss(outputs_bytes=1000, outputs_kept_bytes=200, kept_bytes=3000, backward_peak_bytes=5000,
                     output_grad_bytes=1000)
    events = eager_loss_events(loss, 2)
    assert set(events) == {("fw", 2, "after"), ("bw", 2, "before"), ("bw", 2, "after")}
    assert sum(d for evs in events.values() for _, _, d in evs) == 0  # the gradients: bw_hold
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    fc = forecast(model, (torch.randn(128, 64),), budget=1.0, backend="aot_eager")
    big = EagerLoss(outputs_bytes=10**6, outputs_kept_bytes=0, kept_bytes=10**6, backward_peak_bytes=3 * 10**6,
                    output_grad_bytes=10**6)
    laid = fc.with_eager_loss(big)
    (plan,) = fc._parts.plans
    # the loss's backward peaks on top of what the forward left (saved activations) and what the
    # loss kept: 1 MB kept + 3 MB of its backward
    assert laid.peak_bytes == plan.fw_retained + 4 * 10**6 and laid.eager_loss == big
    assert laid.breakdown.activations + laid.breakdown.gradients <= laid.peak_bytes
    assert {"eager_loss_forward", "eager_loss_backward"} <= {t.node for t in laid.timeline}
    # the timeline ends where the plain one ends: everything the loss made is freed
    assert laid.timeline[-1].bytes == fc.timeline[-1].bytes
    # several calls per step: one measurement per call, each laid in around its own call's end
    with pytest.raises(ValueError, match=r"must be one EagerLoss per call of the model: this forecast is laid out "
                                         r"for 2"):
        fc.repeated(2).with_eager_loss(big)
    two = fc.repeated(2).with_eager_loss([big, big])
    assert two.eager_losses == (big, big) and two.eager_loss is None
    assert [t.node for t in two.timeline].count("eager_loss_forward") == 2
    # the second call's loss backward peaks on both calls' saved activations, the first call's
    # kept megabyte, its own kept megabyte and its 3 MB
    assert two.peak_bytes == 2 * plan.fw_retained + 5 * 10**6


def test_the_outputs_gradients_die_at_the_backwards_last_read_of_its_incoming_gradient() -> None:
    from lightning_memplan.forecasting.layout import lay_out
    from lightning_memplan.forecasting.regions import RegionPlan

    def plan(last_use: int | None) -> RegionPlan:
        return RegionPlan(index=0, method="fx", fw_nodes=("a",), fw_timeline=(10,), fw_retained=10, saved=10,
                     bw_nodes=("b0", "b1", "b2", "b3"), bw_timeline=(0, 100, 50, 300), bw_end=0, bw_peak=300,
                     bw_grads_at_peak=0, gradients=0, tangents=4, tangents_in_timeline=True, grad_copy=0,
                     tangent_last_use=last_use)

    # held 1000 B through step 1 (the last read): the backward's own peak (300) comes after it died
    _, peak, _ = lay_out([plan(1)], None, bw_hold={0: 1000})
    assert peak == 1000 + 100
    # unknown last read: held through the whole backward, an upper bound
    _, peak, _ = lay_out([plan(None)], None, bw_hold={0: 1000})
    assert peak == 1000 + 300


def test_under_inductor_the_realized_stand_in_gradient_holds_the_outputs_gradients() -> None:
    """The stand-in loss's gradient, broadcast to the outputs and read by the head's matmul, is a
    buffer of the outputs' size in inductor's backward: the real gradients are not held again there
    (they were, +9.6% on benchmarks/eager_loss.py's vocabulary-500 row). In an FX plan it is a view."""
    import dataclasses

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 512))
    x = torch.randn(64, 32)
    loss = EagerLoss(outputs_bytes=64 * 512 * 4, outputs_kept_bytes=0, kept_bytes=0, backward_peak_bytes=64 * 512 * 4,
                     output_grad_bytes=64 * 512 * 4)
    no_grads = dataclasses.replace(loss, output_grad_bytes=0)
    ind = forecast(model, (x,), budget=1.0, backend="inductor")
    assert ind._parts.plans[0].method == "inductor_wrapper"
    assert ind.with_eager_loss(loss).peak_bytes == ind.with_eager_loss(no_grads).peak_bytes
    fx = forecast(model, (x,), budget=1.0, backend="aot_eager")
    assert fx.with_eager_loss(loss).peak_bytes > fx.with_eager_loss(no_grads).peak_bytes


def test_an_output_a_later_region_computes_the_loss_from_is_not_counted_again() -> None:
    """The Hugging Face pattern, ``model(ids, labels=ids)``: the model returns its logits and the
    loss it computed from them after a graph break. The logits are an input of the loss's region,
    held in the forecast already; only the loss is the eager part's output (before: the logits
    were counted twice, as the eager code's outputs too)."""

    class LossInside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(16, 1000)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.head(x)
            torch._dynamo.graph_break()
            return logits, F.cross_entropy(logits, y)

    torch.manual_seed(0)
    model = LossInside()
    logits, loss = torch.compile(model, backend="aot_eager", dynamic=False)(torch.randn(64, 16),
                                                                            torch.arange(64) % 1000)
    noted = NotedOutputs.of((logits, loss))
    assert noted.edge_bytes == [64 * 1000 * 4, 4]
    del logits
    (m,) = measure_eager_losses(loss, [noted.now()], exclude=[*model.parameters()])
    assert (m.outputs_bytes, m.kept_bytes, m.output_grad_bytes) == (4, 0, 4), m


def test_the_parameters_a_loss_reaches_through_compiled_and_eager_code() -> None:
    # the compiled region's backward node leads to its parameters' AccumulateGrad nodes; an eager
    # head after it is reached directly; a module nothing calls is not (it gets no gradient)
    model, x, out = _compiled_head(8)
    head, unused = nn.Linear(8, 4), nn.Linear(8, 4)
    loss = head(out).sum()
    reached = parameters_reached(loss)
    assert {id(p) for p in [*model.parameters(), *head.parameters()]} <= reached
    assert not reached & {id(p) for p in unused.parameters()}
    assert id(x) not in reached  # the batch does not require grad
    assert parameters_reached(out.detach().sum()) == set()
    # stopped at the compiled call's outputs: only what the code after the call reads
    assert parameters_reached(loss, stop_at=[get_gradient_edge(out)]) == {id(p) for p in head.parameters()}


def test_a_cross_entropy_measured_at_two_batch_sizes_scales_with_its_outputs() -> None:
    # the fallback for a batch of other shapes whose eager code was not measured: the first batch's
    # measurement scaled by the outputs' bytes equals a measurement at the larger batch
    def measure(rows: int) -> EagerLoss:
        torch.manual_seed(0)
        model = nn.Linear(16, 500)
        x = torch.randn(rows, 16)
        logits = torch.compile(model, backend="aot_eager", dynamic=False)(x)
        edges = [get_gradient_edge(logits)]
        loss = F.cross_entropy(logits, torch.arange(rows) % 500)
        nbytes = logits.untyped_storage().nbytes()
        del logits
        return measure_eager_loss(loss, edges, outputs_bytes=nbytes, live_outputs={},
                                  exclude=[*model.parameters(), x])

    small, large = measure(32), measure(96)
    scaled = scaled_eager_loss(small, 3.0)
    for name in ("outputs_bytes", "kept_bytes", "backward_peak_bytes", "output_grad_bytes"):
        assert abs(getattr(scaled, name) - getattr(large, name)) <= 64, (name, scaled, large)
    assert scaled.param_grad_bytes == small.param_grad_bytes
    with pytest.raises(ValueError, match=r"ratio=0 must be a finite number > 0"):
        scaled_eager_loss(small, 0)


class _Cache:
    """An object pytree does not flatten, holding tensors in a list of layers (as transformers'
    ``DynamicCache`` holds each layer's keys and values)."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.layers = [type("Layer", (), {})()]
        self.layers[0].keys = keys


class _WithLossAndCache(nn.Module):
    """A forward that computes its own loss and returns it beside the logits and a cache, as a
    transformers model called with ``labels=`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(16, 24), nn.Linear(24, 500)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, object]:
        keys = self.proj(x)
        logits = self.head(torch.tanh(keys))
        return {"loss": F.cross_entropy(logits, y), "logits": logits, "cache": _Cache(keys)}


def test_outputs_the_loss_does_not_reach_get_zero_gradients_of_their_size() -> None:
    """``out["loss"]`` alone is differentiated: the logits and the cached keys (found inside the
    cache object) are outputs of the compiled region whose backward runs, so autograd hands it
    zeros as large as each: ``zero_grad_bytes``. With the logits in the loss, only the keys."""
    torch.manual_seed(0)
    model = _WithLossAndCache()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    x, y = torch.randn(64, 16), torch.arange(64) % 500
    logits_bytes, keys_bytes = 64 * 500 * 4, 64 * 24 * 4

    out = compiled(x, y)
    call = NotedOutputs.of(out)
    assert sorted(call.edge_bytes) == [4, keys_bytes, logits_bytes]  # the cache's keys are found
    loss = out["loss"]
    del out
    (m,) = measure_eager_losses(loss, [call.now()], exclude=[*model.parameters(), x, y])
    assert m.zero_grad_bytes == logits_bytes + keys_bytes
    assert m.outputs_bytes == 4 + logits_bytes + keys_bytes

    out = compiled(x, y)
    call = NotedOutputs.of(out)
    loss = out["loss"] + out["logits"].float().mean()
    del out
    (m,) = measure_eager_losses(loss, [call.now()], exclude=[*model.parameters(), x, y])
    assert m.zero_grad_bytes == keys_bytes
