"""graph_buffers on real compiled graphs: lifetimes agree with the estimator, plans validate."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lightning_memplan.forecasting.arena import arena_estimate, graph_buffers
from lightning_memplan.forecasting.backend import memplan_backend
from lightning_memplan.forecasting.estimator import profile_graph
from lightning_memplan.placement import greedy_by_size, peak_live, validate


@pytest.fixture(scope="module")
def graphs() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 8))
    x = torch.randn(32, 64)
    be = memplan_backend(budget=0.5, inner="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = torch.compile(lambda t: model(t).sum(), backend=be)
        fn(x).backward()
    region = be.regions[0]
    assert region.fw_graph is not None and region.bw_graph is not None
    return region.fw_graph, region.bw_graph


def test_live_peak_matches_the_estimator(graphs) -> None:  # type: ignore[no-untyped-def]
    for gm in graphs:
        bufs = graph_buffers(gm.graph)
        assert bufs and all(b.upper > b.lower and b.size > 0 for b in bufs)
        assert peak_live(bufs)[0] == profile_graph(gm.graph).peak_bytes


def test_placement_of_graph_buffers_validates(graphs) -> None:  # type: ignore[no-untyped-def]
    fw, bw = graphs
    bufs = graph_buffers(bw.graph)
    live, _ = peak_live(bufs)
    plan = greedy_by_size(bufs, 4 * live)
    assert validate(plan), validate(plan).message
    est = arena_estimate(bw.graph)
    assert est.arena_bytes >= est.live_peak_bytes == live and est.buffers == len(bufs)
    assert est.overhead >= 0.0
