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
    ax.margins(x=0.15, y=0.08)  # room for the labels at the ends
    fig.tight_layout()
    if annotate:
        _label_points(ax, xs, ys, [p.label for p in points])
    return fig


#: Label offsets tried in turn (points, from the marker): right, left, then further up and down.
_OFFSETS = ((5, 3), (5, -9), (-5, 3), (-5, -9), (5, 11), (5, -17), (-5, 11), (-5, -17), (5, 19), (5, -25))


def _label_points(ax: Axes, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str],
                  fontsize: float = 7) -> None:
    """Label each point at the first offset of :data:`_OFFSETS` whose text box (estimated from the
    label's length, in display pixels) overlaps no label placed before; the last offset when all
    do. Points are labelled left to right, so equal plans stack their labels."""
    fig = ax.figure
    px = fig.dpi / 72  # display pixels per point
    w_char, h = 0.6 * fontsize * px, 1.2 * fontsize * px
    placed: list[tuple[float, float, float, float]] = []
    mid = ax.transAxes.transform((0.5, 0.5))[0]
    for k in sorted(range(len(xs)), key=lambda i: (xs[i], ys[i])):
        x0, y0 = ax.transData.transform((xs[k], ys[k]))
        width = w_char * len(labels[k])
        # right of the marker in the left half, left of it in the right half (inside the axes)
        offsets = _OFFSETS if x0 <= mid else tuple((-dx, dy) for dx, dy in _OFFSETS)
        for dx, dy in offsets:
            left = x0 + dx * px if dx > 0 else x0 + dx * px - width
            box = (left, y0 + dy * px, left + width, y0 + dy * px + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(labels[k], (xs[k], ys[k]), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                    color="0.35", ha="left" if dx > 0 else "right")


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
            ax.text((start + k) / 2, 0.01, phase, ha="center", va="bottom", fontsize=7, color="0.3",
                    transform=ax.get_xaxis_transform())
            start = k
    # the measured peak as a wide pale band under the predicted one's thin line: both stay visible
    # when they agree
    if measured_peak is not None:
        ax.axhline(measured_peak / mib, color="tab:red", lw=5, alpha=0.3, zorder=2,
                   label=f"measured peak {format_bytes(measured_peak)}")
    if predicted_peak is not None:
        ax.axhline(predicted_peak / mib, color="black", ls="--", lw=1, zorder=4,
                   label=f"predicted peak {format_bytes(predicted_peak)}")
    if ys and min(ys) < 0:
        ax.axhline(0, color="0.4", lw=0.8, zorder=1)
        ax.text(len(ys_drawn) - 1, 0, "baseline: it holds the previous step's gradients, so the step dips below it "
                "once zero_grad frees them ", ha="right", va="bottom", fontsize=7, color="0.3")
    ax.set_xlabel("schedule step (FX node)")
    ax.set_ylabel("MiB above baseline")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
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
