"""From a compiled graph to placement buffers: "live bytes" next to "arena needed".

The estimator counts the bytes live at each step of a graph; an allocator without fragmentation
would need exactly that peak, but a static arena (offsets fixed for the whole step) may need more,
because a freed gap is only reusable by a tensor that fits in it. :func:`graph_buffers` turns the
storages a graph allocates into :class:`~lightning_memplan.placement.Buffer` objects with
half-open lifetimes over its schedule, so any placement algorithm can size that arena.

Pure functions over an FX graph (no Trainer). Inputs (placeholders, attributes) are the baseline
and are not placed; views share their base's buffer.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from torch import fx

from lightning_memplan.forecasting.estimator import GraphStorages
from lightning_memplan.placement import Buffer, greedy_by_size, peak_live

__all__ = ["ArenaEstimate", "arena_estimate", "graph_buffers"]


def graph_buffers(
    graph: fx.Graph,
    *,
    order: Sequence[str] | None = None,
    devices: Collection[str] | None = None,
) -> tuple[Buffer, ...]:
    """One buffer per storage the graph allocates, with lifetime ``[alloc step, last use + 1)``.

    Steps index ``order`` (default: the graph order of its call nodes). A storage is live from the
    step of the node that allocates it through the step of its last reader; graph outputs stay live
    to the end (``len(order)``); a storage nobody reads lives one step. ``devices`` keeps only
    storages on those device types (default: all). Buffer ids are ``"<node>:<k>"`` (the allocating
    node, and the storage's position among its outputs); sizes in bytes.

    Invariant: ``peak_live(graph_buffers(g))`` equals the estimator's peak for ``g`` with no live
    inputs and no kernel workspaces (``estimator.profile_graph(g).peak_bytes``).
    """
    st = GraphStorages(graph)
    names = list(order) if order is not None else [
        n.name for n in st.nodes if n.op not in ("placeholder", "get_attr", "output")]
    step = {name: i for i, name in enumerate(names)}
    end = len(names)
    buffers: list[Buffer] = []
    for name in names:
        for k, key in enumerate(st.fresh.get(name, ())):
            if key in st.input_keys or (devices is not None and st.device[key] not in devices):
                continue
            start = step[name]
            if key in st.output_keys:
                upper = end
            else:
                readers = [step[r] for r in st.readers.get(key, ()) if r in step]
                upper = max([start, *readers]) + 1
            buffers.append(Buffer(id=f"{name}:{k}", lower=start, upper=upper, size=st.nbytes[key]))
    return tuple(buffers)


@dataclass(frozen=True, kw_only=True)
class ArenaEstimate:
    """Live bytes vs the arena a static placement needs for one graph (bytes)."""

    live_peak_bytes: int
    """Peak of bytes live at once: what a perfect allocator needs."""
    arena_bytes: int
    """Arena of the placement found (``greedy_by_size`` by default)."""
    buffers: int
    """Number of buffers placed."""

    @property
    def overhead(self) -> float:
        """``arena / live peak - 1`` (0 when nothing is allocated)."""
        return self.arena_bytes / self.live_peak_bytes - 1 if self.live_peak_bytes else 0.0


def arena_estimate(graph: fx.Graph, *, devices: Collection[str] | None = None) -> ArenaEstimate:
    """Live peak and greedy-by-size arena of ``graph``'s allocations (see :func:`graph_buffers`)."""
    bufs = graph_buffers(graph, devices=devices)
    live, _ = peak_live(bufs)
    if not bufs:
        return ArenaEstimate(live_peak_bytes=0, arena_bytes=0, buffers=0)
    plan = greedy_by_size(bufs, max(live, 1) * 4 + sum(b.size for b in bufs))
    return ArenaEstimate(live_peak_bytes=live, arena_bytes=plan.total_arena, buffers=len(bufs))
