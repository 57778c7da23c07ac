"""Pictures and tables of a memory plan: the Pareto frontier of candidate plans, the forecast memory
timeline, and text tables. Pure data in, matplotlib figures out (imported lazily).

Units: memory in bytes throughout; plan cost in whatever unit the caller gives (FLOPs recomputed,
or a step-time ratio), named by ``cost_label``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_memplan.core.front import PlanPoint, pareto_indices
from lightning_memplan.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_frontier", "plot_timeline", "save_figure"]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency
        raise ImportError(
            "Plots need matplotlib: `pip install matplotlib` (or `pip install lightning_memplan`)."
        ) from exc
    return plt


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """``ax`` and its figure, or a new figure of ``figsize`` inches with one axes."""
    if ax is not None:
        return ax.figure, ax
    fig, new_ax = _pyplot().subplots(figsize=figsize, dpi=110)
    return fig, new_ax


def plot_frontier(
    points: Sequence[PlanPoint],
    *,
    knee: int | None = None,
    chosen: int | None = None,
    limit_bytes: int | None = None,
    cost_label: str = "recompute cost (FLOPs)",
    title: str = "Memory plans: forecast peak vs cost",
    annotate: bool = True,
    ax: Axes | None = None,
    cost_rel_tol: float = 1e-3,
) -> Figure:
    """Scatter of all candidate plans (each labelled when ``annotate``), their Pareto front as a
    line (``cost_rel_tol`` as :func:`pareto_indices`; the search's knee uses the same 1e-3), the
    knee and the chosen plan marked, and an optional memory limit as a vertical line. Returns the
    figure."""
    fig, ax = _axes(ax, (7, 4.5))
    mib = 2.0**20
    xs = [p.peak_bytes / mib for p in points]
    ys = [p.cost for p in points]
    ax.scatter(xs, ys, s=18, color="0.65", label="candidate plans", zorder=2)
    if annotate:
        for k, p in enumerate(points):  # alternate offsets: near-equal plans sit on top of each other
            ax.annotate(p.label, (xs[k], ys[k]), textcoords="offset points",
                        xytext=(5, 4 if k % 2 == 0 else -10), fontsize=7, color="0.35")
    front = pareto_indices(points, cost_rel_tol=cost_rel_tol)
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-o", color="tab:blue", ms=4,
            label="Pareto front", zorder=3)
    if knee is not None:
        ax.scatter([xs[knee]], [ys[knee]], s=140, facecolors="none", edgecolors="tab:orange",
                   linewidths=2, label=f"knee: {points[knee].label}", zorder=4)
    if chosen is not None:
        ax.scatter([xs[chosen]], [ys[chosen]], s=70, marker="*", color="tab:red",
                   label=f"chosen: {points[chosen].label}", zorder=5)
    if limit_bytes is not None:
        ax.axvline(limit_bytes / mib, color="tab:red", ls="--", lw=1,
                   label=f"max_memory {format_bytes(limit_bytes)}")
    ax.set_xlabel("forecast peak above baseline (MiB)")
    ax.set_ylabel(cost_label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_timeline(
    timeline: Sequence[tuple[str, int]],
    *,
    predicted_peak: int | None = None,
    measured_peak: int | None = None,
    title: str = "Forecast memory timeline of one training step",
    ax: Axes | None = None,
) -> Figure:
    """Bytes live above the baseline at each step of the forecast schedule, shaded by phase
    (``(phase, bytes)`` pairs in execution order), with the predicted and measured peaks as
    horizontal lines. Returns the figure."""
    fig, ax = _axes(ax, (8, 4))
    mib = 2.0**20
    ys = [b / mib for _, b in timeline]
    ys_drawn = ys + ys[-1:]  # the last step gets a width too
    ax.step(range(len(ys_drawn)), ys_drawn, where="post", color="tab:blue", lw=1.2, label="forecast live bytes")
    colors = {"forward": "tab:green", "backward": "tab:purple", "optimizer": "tab:brown"}
    start = 0
    for k in range(1, len(timeline) + 1):
        if k == len(timeline) or timeline[k][0] != timeline[start][0]:
            phase = timeline[start][0]
            ax.axvspan(start, k, color=colors.get(phase, "0.8"), alpha=0.08)
            ax.text((start + k) / 2, 0, phase, ha="center", va="bottom", fontsize=7, color="0.3")
            start = k
    if predicted_peak is not None:
        ax.axhline(predicted_peak / mib, color="tab:blue", ls=":", lw=1,
                   label=f"predicted peak {format_bytes(predicted_peak)}")
    if measured_peak is not None:
        ax.axhline(measured_peak / mib, color="tab:red", ls="--", lw=1.2,
                   label=f"measured peak {format_bytes(measured_peak)}")
    ax.set_xlabel("schedule step (FX node)")
    ax.set_ylabel("MiB above baseline")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG to ``path`` (directories created) and close it; returns the path."""
    plt = _pyplot()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
