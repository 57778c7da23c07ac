from __future__ import annotations

from pathlib import Path

import numpy as np

from lightning_memplan.core.front import PlanPoint, pareto_indices
from lightning_memplan.report import plot_frontier, plot_timeline, save_figure


def test_pareto_indices_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        pts = [PlanPoint(label=str(i), peak_bytes=int(rng.integers(0, 6)), cost=float(rng.integers(0, 6)))
               for i in range(n)]
        front = pareto_indices(pts)
        dominated = {
            i for i in range(n) for j in range(n)
            if (pts[j].peak_bytes <= pts[i].peak_bytes and pts[j].cost <= pts[i].cost
                and (pts[j].peak_bytes, pts[j].cost) != (pts[i].peak_bytes, pts[i].cost))
        }
        keys = {(pts[i].peak_bytes, pts[i].cost) for i in front}
        assert not (set(front) & dominated)
        assert keys == {(p.peak_bytes, p.cost) for i, p in enumerate(pts) if i not in dominated}
        assert [pts[i].peak_bytes for i in front] == sorted(pts[i].peak_bytes for i in front)


def test_near_equal_costs_are_ties_with_a_tolerance() -> None:
    import pytest

    # b saves half the memory of a for 1e-7 more cost: without a tolerance a stays on the front
    pts = [PlanPoint(label="a", peak_bytes=100, cost=1e11), PlanPoint(label="b", peak_bytes=50, cost=1e11 + 1e4),
           PlanPoint(label="c", peak_bytes=10, cost=2e11)]
    assert pareto_indices(pts) == [2, 1, 0]
    assert pareto_indices(pts, cost_rel_tol=1e-3) == [2, 1]
    with pytest.raises(ValueError, match=r"`pareto_indices\(cost_rel_tol=1\.5\)` must be in \[0, 1\)"):
        pareto_indices(pts, cost_rel_tol=1.5)


def test_plots_write_pngs(tmp_path: Path) -> None:
    pts = [PlanPoint(label=f"b{b}", peak_bytes=int((1.2 - b) * 2**24), cost=b**2 * 1e9) for b in np.linspace(0, 1, 9)]
    fig = plot_frontier(pts, knee=4, chosen=5, limit_bytes=2**23)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("knee: b0.5") for t in labels) and any("max_memory 8.00 MiB" in t for t in labels)
    p1 = save_figure(fig, tmp_path / "a" / "frontier.png")
    timeline = [("forward", i * 2**20) for i in range(10)] + [("backward", (10 - i) * 2**20) for i in range(10)]
    fig2 = plot_timeline(timeline, predicted_peak=10 * 2**20, measured_peak=9 * 2**20)
    texts = [t.get_text() for t in fig2.axes[0].texts]
    assert texts == ["forward", "backward"]
    p2 = save_figure(fig2, tmp_path / "timeline.png")
    for p in (p1, p2):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
