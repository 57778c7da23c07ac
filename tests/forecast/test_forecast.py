"""forecast(): predicted vs profiler-measured peak of a training step, invariants, faults, bad input."""
from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

import lightning_memplan
from lightning_memplan import Forecast, forecast, measure_peak
from lightning_memplan.forecasting import backend as mp_compile
from lightning_memplan.forecasting.allocations import (
    accumulation_order,
    lightning_order,
    simulate_cuda_allocator,
)
from lightning_memplan.planner.step_model import (
    TrainingLoop,
    lightning_step_memory,
    lightning_step_timeline,
)

X = torch.randn(1024, 256)


def measured(fc: Forecast) -> int:
    fc.step()  # warm-up: creates the optimizer state, as in steady-state training
    return measure_peak(fc.step, device="cpu")


def rel_error(fc: Forecast) -> float:
    m = measured(fc)
    assert fc.peak_bytes is not None
    return (fc.peak_bytes - m) / m


def check_allocations(fc: Forecast) -> None:
    """The step's allocation stream is the timeline storage by storage: same peak, each block freed once."""
    steps = fc.allocations
    assert steps is not None, fc.problems
    assert steps.requested_peak_bytes == fc.peak_bytes == fc.requested_peak_bytes
    allocated = [e.key for e in steps.events if e.op == "alloc"]
    freed = [e.key for e in steps.events if e.op == "free"]
    assert len(set(allocated)) == len(allocated) and sorted(freed) == sorted(allocated)
    assert fc.cuda_allocator is None  # the parameters are on the CPU
    sim = simulate_cuda_allocator(steps, device="cpu")  # what CUDA's allocator would make of it
    assert sim.requested_peak_bytes == fc.peak_bytes
    assert fc.peak_bytes <= sim.allocated_peak_bytes <= sim.allocated_max_bytes <= sim.reserved_peak_bytes
    if fc.optimizer is not None:  # Lightning's order: the stream peaks where its timeline does
        grads = fc.breakdown.parameters  # every parameter trains: one gradient each
        lit = lightning_order(steps)
        assert lit.requested_peak_bytes == max([0, *(b for _, b in lightning_step_timeline(fc, grads))])
        assert simulate_cuda_allocator(lit, device="cpu").requested_peak_bytes == lit.requested_peak_bytes
        acc = accumulation_order(steps)  # accumulate_grad_batches > 1: the micro-batch that steps
        assert acc.requested_peak_bytes == max([0, *(b for _, b in lightning_step_timeline(fc, grads, TrainingLoop(2)))])
        assert simulate_cuda_allocator(acc, device="cpu").requested_peak_bytes == acc.requested_peak_bytes
        with pytest.raises(ValueError, match=r"`accumulate_grad_batches=0` must be an int >= 1"):
            TrainingLoop(0)
        # manual optimization: forecast()'s own step, above a baseline without gradients
        manual = TrainingLoop(automatic_optimization=False)
        assert lightning_step_timeline(fc, grads, manual) == [(s.phase, s.bytes) for s in fc.timeline]
        assert lightning_step_memory(fc, grads, manual) == (fc.baseline_bytes, fc.peak_bytes)


@pytest.fixture(scope="module")
def mlp_forecasts(make_mlp: Callable[..., nn.Module]) -> dict[float, Forecast]:
    out = {}
    for b in (1.0, 0.5, 0.2):
        model = make_mlp()
        out[b] = forecast(model, (X,), budget=b, backend="aot_eager_decomp_partition",
                          optimizer=torch.optim.Adam(model.parameters()),
                          loss_fn=lambda y: y.pow(2).mean())
    return out


@pytest.mark.parametrize("budget", [1.0, 0.5, 0.2])
def test_mlp_forecast_matches_measured_peak(mlp_forecasts: dict[float, Forecast], budget: float) -> None:
    fc = mlp_forecasts[budget]
    assert fc.status == "ok" and fc.problems == ()
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.03


def test_breakdown_and_timeline_invariants(mlp_forecasts: dict[float, Forecast]) -> None:
    for fc in mlp_forecasts.values():
        bd = fc.breakdown
        assert bd.parameters + bd.buffers + bd.inputs + bd.optimizer_state == fc.baseline_bytes
        assert bd.activations + bd.gradients + bd.optimizer_temporaries == fc.peak_bytes
        assert max(s.bytes for s in fc.timeline) == fc.peak_bytes
        assert [s.phase for s in fc.timeline][-2:] == ["optimizer", "optimizer"]
        assert fc.timeline[-1].bytes == 4  # after zero_grad only the returned float32 loss is left
        assert bd.parameters == 4 * (256 * 256 + 256) * 4  # four Linear(256, 256), float32
        assert bd.inputs == X.numel() * 4
        assert bd.optimizer_state == 2 * bd.parameters + 8 * 4  # Adam: two moments + a 4-byte step per param


def test_lower_budget_forecasts_fewer_saved_bytes(mlp_forecasts: dict[float, Forecast]) -> None:
    saved = [mlp_forecasts[b].regions[0].saved_bytes for b in (1.0, 0.5, 0.2)]
    assert saved[0] > saved[1] > saved[2]
    assert [mlp_forecasts[b].regions[0].decision.reason for b in (1.0, 0.5, 0.2)] == ["budget_1", "solved", "solved"]


def test_peers_are_reported(mlp_forecasts: dict[float, Forecast]) -> None:
    from lightning_memplan._torch.inductor import torch_fx_peak_estimate

    fc = mlp_forecasts[0.5]
    region = fc.regions[0]
    # torch's estimate is a peer for the benchmark table: computed when read, never by a plan search
    assert "torch_fx_peak_bytes" not in vars(region) and "torch_fx_estimate_bytes" not in vars(fc)
    assert fc.torch_fx_estimate_bytes is not None and fc.torch_fx_estimate_bytes > 0
    capture = fc._backend.regions[0]
    assert region.torch_fx_peak_bytes == torch_fx_peak_estimate(capture.fw_graph.graph, capture.bw_graph.graph)
    assert fc.torch_fx_estimate_bytes == region.torch_fx_peak_bytes  # one region
    assert fc.solver_estimate_bytes is not None and 0 < fc.solver_estimate_bytes < fc.peak_bytes


def test_cnn_with_batch_norm_and_model_left_unchanged(make_cnn: Callable[..., nn.Module]) -> None:
    model = make_cnn()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(32, 3, 32, 32)
    fc = forecast(model, x, budget=0.5, backend="aot_eager")
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # BN stats restored
    assert all(p.grad is None for p in model.parameters())
    assert fc.breakdown.buffers == sum(b.numel() * b.element_size() for b in model.buffers())
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.05


def test_graph_breaks_are_forecast_per_region(make_mlp: Callable[..., nn.Module]) -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = make_mlp(depth=2), make_mlp(depth=2, seed=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            torch._dynamo.graph_break()
            return self.b(y)

    model = Broken()
    fc = forecast(model, (X,), budget=0.5, backend="aot_eager", optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert len(fc.regions) >= 2 and fc.status == "ok"
    assert {s.region for s in fc.timeline if s.phase == "backward"} == {r.index for r in fc.regions}
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.05
    # whole-graph rematerialization plans every region on its own joint graph
    torch._dynamo.reset()
    fc = forecast(model, (X,), budget=0.3, solver="remat", backend="aot_eager")
    assert len(fc.regions) >= 2 and fc.status == "ok", fc.problems
    assert [r.decision.reason for r in fc.regions if r.decision] == ["remat"] * len(fc.regions)
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.05


class _BreakBlock(nn.Module):
    """A residual MLP block with a graph break at ``where``: dynamo compiles the block's code once
    (two regions when the break is inside) and runs it for every block."""

    def __init__(self, width: int, where: str) -> None:
        super().__init__()
        self.fc1, self.fc2, self.where = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "start":
            torch._dynamo.graph_break()
        h = torch.nn.functional.gelu(self.fc1(x))
        if self.where == "inside":  # h is this frame's local: it dies when the block returns
            torch._dynamo.graph_break()
        return x + self.fc2(torch.tanh(h))


@pytest.mark.parametrize("where", ["start", "inside"])
def test_a_region_run_several_times_is_laid_out_per_call(where: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[_BreakBlock(64, where) for _ in range(4)], nn.Linear(64, 1))
    x = torch.randn(256, 64)
    torch._dynamo.reset()
    fc = forecast(model, (x,), budget=1.0, backend="aot_eager", optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert fc.status == "ok", fc.problems
    # one compiled block code, called by three of the four blocks (the first is inlined in the
    # Sequential's own frame); before: laid out once, -36% (start) and -28% (inside)
    assert max(r.calls for r in fc.regions) == 3
    assert sum(r.calls for r in fc.regions) == len(fc._backend.executions) > len(fc.regions)
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.02


def test_a_plans_cost_counts_every_call_of_a_shared_graph() -> None:
    """A plan's cost (FLOPs, what a search ranks plans by) is one step's: a block graph that dynamo
    compiled once and runs for three blocks costs three times. Before, each graph counted once: the
    broken models cost about half the whole graph's, and under FSDP2 (one graph for every unit)
    checkpointing one block of three looked costlier than checkpointing all three."""
    from lightning_memplan.planner.search import forecast_flops

    costs = {}
    for where in ("none", "start", "inside"):
        torch.manual_seed(0)
        model = nn.Sequential(*[_BreakBlock(64, where) for _ in range(4)], nn.Linear(64, 1))
        torch._dynamo.reset()
        fc = forecast(model, (torch.randn(256, 64),), budget=1.0, backend="aot_eager")
        assert fc.status == "ok", fc.problems
        costs[where] = forecast_flops(fc)
    assert len({r.calls for r in fc.regions}) > 1  # the broken models share graphs between blocks
    # the same matmuls in one graph or in shared ones (the head's tiny sum may move between regions)
    assert costs["start"] == pytest.approx(costs["none"], rel=1e-3), costs
    assert costs["inside"] == pytest.approx(costs["none"], rel=1e-3), costs


def test_inductor_frees_an_incoming_gradient_where_its_backward_deletes_it() -> None:
    """Under inductor the first half of a broken block deletes its incoming gradient mid-backward
    (``del tangents_1``; AOTAutograd's boxed call dropped its own reference, so the storage goes).
    Held to the end of the backward instead, the forecast was +7.7% on the benchmark's ``breaks``
    model (here -5.2%). The head after the last block runs uncompiled (dynamo skips ``torch.nn`` frames): the
    gradient it consumed dies where the timeline says, so the allocation stream peaks with it."""
    torch.manual_seed(0)
    model = nn.Sequential(_BreakBlock(64, "inside"), nn.Linear(64, 1))  # before: -5.2%, stream +2 KiB
    x = torch.randn(512, 64)
    torch._dynamo.reset()
    fc = forecast(model, (x,), budget=0.5, backend="inductor", loss_fn=lambda y: y.pow(2).mean(),
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert fc.status == "ok", fc.problems
    assert {r.method for r in fc.regions} == {"inductor_wrapper"}
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.02


def test_forecasts_of_one_model_never_run_out_of_recompiles() -> None:
    """Every forecast compiles the blocks' own frames again, with its own backend. Sharing one set of
    entries they hit dynamo's recompile_limit (8) at the fifth forecast of one model, and the blocks
    then ran uncompiled, unseen by the forecast (one region left, -91%)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_BreakBlock(64, "inside") for _ in range(4)], nn.Linear(64, 1))
    x = torch.randn(256, 64)
    torch._dynamo.reset()
    for budget in (1.0, 0.3, 1.0, 0.3, 0.5, 0.2):
        fc = forecast(model, (x,), budget=budget, backend="aot_eager")
        assert len(fc.regions) == 5 and sum(r.calls for r in fc.regions) == 9, (budget, fc.problems)
        assert {r.decision.budget for r in fc.regions if r.decision} == {budget}
    assert abs(rel_error(fc)) <= 0.02


@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_state_a_forward_makes_at_its_first_call_is_not_forecast_every_step(budget: float) -> None:
    """Lightning's demo ``PositionalEncoding`` makes its table (5000 positions) at its first call and
    keeps it on the module: that call's graph computes it, every later call's reads it. The forecast
    laid out the first graph, which never runs again (+1270% here; +32% and +312% at budgets 1.0
    and 0.5 on Lightning's demo Transformer without its graph break); it now lays out the graph of
    the second, steady call."""
    from lightning.pytorch.demos.transformer import PositionalEncoding

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), PositionalEncoding(64, dropout=0.0), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 32, 16)
    fc = forecast(model, (x,), budget=budget, backend="aot_eager")
    assert model[1].pe is not None  # made by the forecast's first run, as the first training step makes it
    assert abs(rel_error(fc)) <= 0.01, (fc.peak_bytes, fc.problems)


@pytest.mark.parametrize("budget", [1.0, 0.7])
def test_a_region_fed_by_another_frees_its_outputs_it_does_not_keep(budget: float) -> None:
    """Lightning's demo Transformer breaks its graph inside ``nn.TransformerDecoder``: the second
    region takes the first's outputs (the encoder's memory, the decoder's input, the mask) and the
    targets the loss closes over. With the last decoder layer checkpointed it saves its own copies
    of the first three, so they die when its forward has run; that it saves the targets (live
    anyway) kept them live through its backward: +0.6% at budget 1.0, +3.0% at 0.7."""
    from lightning.pytorch.demos import Transformer

    from lightning_memplan.planner.checkpointing import checkpointed

    torch.manual_seed(0)
    model = Transformer(vocab_size=512, ninp=64, nhead=4, nhid=128, nlayers=2, dropout=0.0)
    inputs, targets = torch.randint(0, 512, (4, 32)), torch.randint(0, 512, (4, 32))
    with checkpointed(model, ["transformer.decoder.layers.1"]):
        fc = forecast(model, (inputs, targets), budget=budget, backend="aot_eager",
                      loss_fn=lambda out: torch.nn.functional.nll_loss(out, targets.view(-1)))
        assert len({r.index for r in fc.regions}) >= 2
        assert abs(rel_error(fc)) <= 0.005, (fc.peak_bytes, fc.problems)


def test_repeated_lays_a_step_out_for_several_calls_of_the_model(make_mlp: Callable[..., nn.Module]) -> None:
    """Two views of a batch through one compiled model: both calls' saved activations are live until
    their backwards, and the first call's parameter gradients are summed into the second's in
    autograd's input buffers (out of place: one sum is transient). Forecast for one call the step was
    27% low here."""
    from lightning_memplan.forecasting.backend import memplan_backend

    model = make_mlp(width=128, depth=3)
    x = torch.randn(256, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fc = forecast(model, (x,), budget=0.5, backend="aot_eager", optimizer=opt)
    two = fc.repeated(2, new_input_bytes=x.numel() * x.element_size())  # x.flip(0) is a new tensor
    assert fc.repeated(1) is fc and {r.calls for r in two.regions} == {2} and two.allocations is None
    with pytest.raises(ValueError, match=r"`Forecast.repeated\(calls=0\)` must be an int >= 1"):
        fc.repeated(0)
    with pytest.raises(ValueError, match=r"`Forecast.repeated\(new_input_bytes=\[1, 2\]\)` must be an int >= 0 or 1 of"):
        fc.repeated(2, new_input_bytes=[1, 2])
    compiled = torch.compile(lambda t: model(t).sum(), backend=memplan_backend(budget=0.5, inner="aot_eager"))

    def step() -> None:
        (compiled(x) + compiled(x.flip(0))).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    measured = measure_peak(step, device="cpu")
    assert fc.peak_bytes < 0.9 * measured  # one call's forecast does not cover it
    print(f"\none call {fc.peak_bytes}, two calls {two.peak_bytes}, measured {measured}")
    assert abs(two.peak_bytes - measured) / measured <= 0.02

def test_with_calls_lays_a_step_out_for_calls_of_other_shapes(make_mlp: Callable[..., nn.Module]) -> None:
    """A labeled batch and a 4x larger unlabeled one through one compiled model (semi-supervised
    steps): dynamo compiles graphs per shape, so the second call is its own forecast. Laid out as
    :meth:`repeated` would lay out the first call twice, the step was 57% low here."""
    from lightning_memplan.forecasting.backend import memplan_backend

    model = make_mlp(width=128, depth=3)
    x, u = torch.randn(64, 128), torch.randn(256, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fc = forecast(model, (x,), budget=0.5, backend="aot_eager", optimizer=opt)
    fc_u = forecast(model, (u,), budget=0.5, backend="aot_eager", optimizer=opt)
    # the same shapes: exactly what repeated lays out
    same, twice = fc.with_calls([fc]), fc.repeated(2)
    assert same.calls == twice.calls == 2 and same.peak_bytes == twice.peak_bytes and same.timeline == twice.timeline
    both = fc.with_calls([fc_u])
    with pytest.raises(ValueError, match=r"`Forecast.with_calls\(others=...\)` takes successful forecasts of the same"):
        fc.with_calls([forecast(model, (u,), budget=1.0, backend="aot_eager", optimizer=opt)])
    with pytest.raises(ValueError, match=r"on a forecast laid out for one call; got 1 \(0 unusable\) on one laid out "
                                         r"for 2"):
        twice.with_calls([fc_u])
    compiled = torch.compile(lambda t: model(t).sum(), backend=memplan_backend(budget=0.5, inner="aot_eager"))

    def step() -> None:
        (compiled(x) + compiled(u)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    measured = measure_peak(step, device="cpu")
    print(f"\nrepeated {twice.peak_bytes}, with_calls {both.peak_bytes}, measured {measured}")
    assert twice.peak_bytes < 0.8 * measured
    assert abs(both.peak_bytes - measured) / measured <= 0.02


def test_capture_failure_is_reported_and_step_still_trains(
    monkeypatch: pytest.MonkeyPatch, make_mlp: Callable[..., nn.Module]
) -> None:
    def broken(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        raise RuntimeError("snapshot exploded")

    monkeypatch.setattr(mp_compile, "_snapshot", broken)
    model = make_mlp(depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match=r"forecast: failed: .*snapshot exploded"):
        fc = forecast(model, (X[:8],), backend="aot_eager", optimizer=opt)
    assert fc.status == "failed" and fc.peak_bytes is None and fc.breakdown is None
    before = model[0].weight.detach().clone()
    fc.step()
    assert not torch.equal(before, model[0].weight)


def test_global_config_unchanged_after_forecast(make_mlp: Callable[..., nn.Module]) -> None:
    fconfig = importlib.import_module("torch._functorch.config")
    before = (fconfig.activation_memory_budget, fconfig.activation_memory_budget_solver,
              torch.compiler.config.force_disable_caches)
    fc = forecast(make_mlp(depth=1), (X[:64],), budget=0.3, backend="aot_eager")
    fc.step()
    assert (fconfig.activation_memory_budget, fconfig.activation_memory_budget_solver,
            torch.compiler.config.force_disable_caches) == before


def test_exports() -> None:
    assert {"forecast", "Forecast", "measure_peak", "__version__"} <= set(lightning_memplan.__all__)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 2.0}, r"`forecast\(budget=2\.0\)` is not a valid activation memory budget\. Expected a float in \[0\.0, 1\.0\]"),
        ({"solver": "simplex"}, r"`forecast\(solver='simplex'\)` is not a known solver\. Expected one of 'greedy', 'dp'"),
        ({"backend": "eager"}, r"`forecast\(backend='eager'\)` is not a supported backend\. Expected one of 'inductor'"),
        ({"loss_fn": 3}, r"`forecast\(loss_fn=3\)` is not callable"),
        ({"optimizer": "adam"}, r"`forecast\(optimizer='adam'\)` is not a torch\.optim\.Optimizer, or None"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        forecast(nn.Linear(2, 2), torch.randn(1, 2), **kwargs)  # type: ignore[arg-type]


def test_bad_model_and_inputs() -> None:
    with pytest.raises(ValueError, match=r"`forecast\(model='net'\)` is not a torch\.nn\.Module"):
        forecast("net", torch.randn(1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`forecast\(example_inputs=\[1, 2\]\)` is not a tensor or a tuple of tensors"):
        forecast(nn.Linear(2, 2), [1, 2])  # type: ignore[arg-type]


def test_inductor_scheduler_forecast(make_mlp: Callable[..., nn.Module]) -> None:
    model = make_mlp()
    fc = forecast(model, (X,), budget=0.5, backend="inductor", optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert fc.status == "ok", fc.problems
    assert [r.method for r in fc.regions] == ["inductor_wrapper"]
    region = fc._backend.regions[0]
    for est in (region.fw_schedule, region.bw_schedule, region.fw_wrapper, region.bw_wrapper):
        assert est is not None and est.peak_bytes == max(est.timeline)
    # inductor fuses: its own estimate peaks below torch's estimate of the unfused FX graphs
    assert max(region.fw_schedule.peak_bytes, region.bw_schedule.peak_bytes) < fc.regions[0].torch_fx_peak_bytes
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.05


class _Attention(nn.Module):
    """One causal self-attention layer: its backward is a multi-output fallback kernel under inductor."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def test_inductor_counts_a_multi_output_kernels_outputs_where_it_allocates_them() -> None:
    # The attention backward allocates grad q, k and v while its inputs are still live; the wrapper
    # names them only after deleting those inputs. Counting them there missed one (b, t, 3c) buffer
    # at the peak (-11.6% on a GPT before the fix).
    torch.manual_seed(0)
    model = _Attention()
    fc = forecast(model, (torch.randn(8, 128, 64),), backend="inductor",
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert fc.status == "ok", fc.problems
    assert [r.method for r in fc.regions] == ["inductor_wrapper"]
    # q, k and v are saved as views of one qkv buffer: one block, freed with its last view
    check_allocations(fc)
    fc.step()
    measured = measure_peak(fc.step)
    assert fc.peak_bytes == pytest.approx(measured, rel=0.01)


class _CheckpointedAttention(nn.Module):
    """Four small attention layers, each under the user's own ``torch.utils.checkpoint``: tiny, so
    the CPU generator states checkpointing saves (5,056 B each) weigh."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Attention(16, 2) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return x


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointed_random_ops_count_their_rng_states_and_scratch(backend: str) -> None:
    """Checkpointing runs a random op (attention, dropout) under a saved RNG state: forward
    ``run_and_save_rng_state(op, ...)``, recomputation ``run_with_rng_state(state, op, ...)``. Those
    higher-order ops have no output value of their own in the graph, the backward's state
    placeholders share no storage with the forward, and the op inside is not a node to probe. The
    states were taken for incoming gradients (held to the backward's end: +2.1% on a checkpointed
    GPT in a Lightning fit), the op's outputs were made at its ``getitem``s, and neither the op's
    scratch nor the state the recomputation saves was counted. Before: +40.8% (aot_eager), -15.2%
    (inductor)."""
    torch.manual_seed(0)
    model = _CheckpointedAttention()
    torch._dynamo.reset()
    fc = forecast(model, (torch.randn(2, 8, 16),), backend=backend,
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    assert fc.status == "ok", fc.problems
    [region] = fc.regions
    state = torch.get_rng_state().untyped_storage().nbytes()
    assert region.saved_bytes >= 4 * state  # each layer's state is kept for its recomputation
    check_allocations(fc)
    fc.step()
    assert fc.peak_bytes == pytest.approx(measure_peak(fc.step), rel=0.005)


@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_dropout_under_eager_kernels_counts_the_masks_cast_copy(budget: float) -> None:
    """Dropout decomposes to ``rand``, ``gt`` and a ``bool`` mask times the activation; on CPU that
    product copies the mask into a float32 temporary as large as the activation. At budget 0.5 the
    step peaks at that product: -5.6% before (one hidden activation missing)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, 128), nn.Dropout(0.1),
                          nn.Linear(128, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, 1))
    torch._dynamo.reset()
    fc = forecast(model, (torch.randn(512, 128),), budget=budget, backend="aot_eager",
                  optimizer=torch.optim.AdamW(model.parameters()))
    assert fc.status == "ok", fc.problems
    check_allocations(fc)
    assert abs(rel_error(fc)) <= 0.005


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_forecast_is_the_caching_allocators_peak() -> None:
    # Run on a GPU machine: PYTHONPATH=. python -m pytest -s tests/forecast/test_forecast.py -k cuda
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    model = _Attention().cuda()
    fc = forecast(model, (torch.randn(8, 128, 64, device="cuda"),), backend="inductor",
                  optimizer=torch.optim.AdamW(model.parameters()))
    sim = fc.cuda_allocator
    assert sim is not None and sim.device == "cuda" and fc.peak_bytes == sim.allocated_peak_bytes
    assert fc.requested_peak_bytes == fc.allocations.requested_peak_bytes <= fc.peak_bytes
    fc.step()
    measured = measure_peak(fc.step, device="cuda")
    print(f"\ncuda attention: allocator forecast {fc.peak_bytes} B, requested forecast {fc.requested_peak_bytes} B, "
          f"measured {measured} B, reserved forecast {sim.reserved_peak_bytes} B vs {torch.cuda.memory_reserved()} B")
    assert fc.peak_bytes == pytest.approx(measured, rel=0.05)


def test_with_optimizer_memory_lays_out_the_step_the_optimizer_takes() -> None:
    # the optimizer also holds a layer the model never calls: the real step skips it (no gradient),
    # forecast() counted its state and step temporaries; with_optimizer_memory lays out the real one
    from lightning_memplan.forecasting.optim_memory import optimizer_memory

    torch.manual_seed(0)
    model, extra = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)), nn.Linear(256, 512)
    opt = torch.optim.AdamW([*model.parameters(), *extra.parameters()], foreach=True)
    fc = forecast(model, (torch.randn(4, 256),), budget=1.0, backend="aot_eager", optimizer=opt)
    fixed = fc.with_optimizer_memory(optimizer_memory(opt, gradless={id(p) for p in extra.parameters()}))
    for _ in range(2):
        fc.step()
    measured = measure_peak(fc.step)
    assert abs(fixed.peak_bytes - measured) <= 0.01 * measured < fc.peak_bytes - measured
    skipped = fc.optimizer.state_bytes - fixed.optimizer.state_bytes
    assert skipped >= 2 * 4 * sum(p.numel() for p in extra.parameters())  # AdamW's two moments
    assert fixed.baseline_bytes == fc.baseline_bytes - skipped
    assert fixed.breakdown.optimizer_state == fc.breakdown.optimizer_state - skipped


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_parameters_read_under_no_grad_are_named_gradless(backend: str) -> None:
    # the compiled backward returns None for the stem's weights: no gradient, though autograd links them to it
    class Stem(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.body = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                x = self.stem(x)
            return self.body(x)

    model = Stem()
    fc = forecast(model, (torch.randn(8, 16),), backend=backend)
    stem = {id(p) for p in model.stem.parameters()}
    assert fc.compiled_gradless_parameter_ids == stem
    assert stem < fc.compiled_parameter_ids
