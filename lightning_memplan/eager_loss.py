"""The eager code between the compiled forward and its backward: the loss ``training_step`` computes.

Lightning's ``training_step`` calls the compiled forward and then computes the loss on its outputs
in plain PyTorch: ``F.cross_entropy(logits, y)`` makes a log-softmax as large as the logits and
keeps it for backward, and its backward makes two more tensors of that size before the compiled
backward even starts (its incoming gradient is the last of them). None of that is in the compiled
graphs, and for a language model (a vocabulary of 8,000: the logits are 33 MB of a 98 MB step) it
was most of the step's peak.

:func:`measure_eager_loss` measures that part once, on a real step, at the point the backward is
about to start: what the loss's autograd nodes keep (their saved tensors, found by walking the
graph from the loss down to the compiled forward's outputs), and the peak of the loss's own
backward, run once with ``torch.autograd.grad`` up to the outputs (``retain_graph``: the real
backward still runs after it). :func:`eager_loss_events` turns the measurement into layout events
at the boundary of the forecast's last forward and first backward, so every candidate plan can be
judged with it (the eager part does not depend on the plan). Pure on plain data, except the
measurement, which needs the live autograd graph.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from . import _compat
from .measure import PeakWindow

__all__ = ["EagerLoss", "eager_loss_events", "measure_eager_loss"]


@dataclass(frozen=True)
class EagerLoss:
    """What the eager code between the forward and the backward holds and makes, in bytes.

    Invariants: every field >= 0; ``outputs_kept_bytes <= outputs_bytes``.
    """

    #: The compiled forward's outputs (all of them, as returned): live while the loss is computed.
    outputs_bytes: int
    #: Of those, the bytes still live when the backward starts: saved by the loss's autograd nodes
    #: (``F.mse_loss`` keeps its input) or still referenced (outputs returned from training_step).
    outputs_kept_bytes: int
    #: Other bytes the loss's autograd nodes keep for backward (their saved tensors, each storage
    #: once: ``F.cross_entropy``'s log-softmax), without parameters and the batch.
    kept_bytes: int
    #: Peak of the loss's own backward (from the loss down to the outputs' gradients) above the
    #: bytes live when it starts, the kept tensors still held.
    backward_peak_bytes: int
    #: The gradients of the outputs it ends with: the compiled backward's incoming gradients.
    output_grad_bytes: int


def eager_loss_events(loss: EagerLoss, last: int) -> dict[tuple[str, int, str], list[tuple[str, str, int]]]:
    """Layout events (``forecasting._layout``'s ``overlay``: ``(name, category, bytes)`` at
    ``("fw" | "bw", position, "before" | "after")``) for ``loss`` around position ``last``, the
    step's last compiled region:

    - after its forward: the outputs and the loss's kept tensors, then the outputs that are not
      kept freed;
    - before its backward: the loss's backward peak (the outputs' gradients it ends with
      included), then all of it but those gradients freed with the kept tensors;
    - after its backward: the kept outputs freed (taken to live through the whole region's backward).

    The outputs' gradients themselves are handed to the region's backward and die at its last read
    of its incoming gradient: ``_layout``'s ``bw_hold`` (``output_grad_bytes``), not an event here.
    Category ``"activations"``. The events sum to zero.
    """
    a = "activations"
    dropped = loss.outputs_bytes - loss.outputs_kept_bytes
    return {
        ("fw", last, "after"): [("eager_loss_forward", a, loss.outputs_bytes + loss.kept_bytes),
                                ("eager_outputs_freed", a, -dropped)],
        ("bw", last, "before"): [("eager_loss_backward", a, loss.backward_peak_bytes),
                                 ("eager_loss_backward_end", a, -loss.backward_peak_bytes - loss.kept_bytes)],
        ("bw", last, "after"): [("eager_outputs_freed_after_backward", a, -loss.outputs_kept_bytes)],
    }


def _saved_tensors(node: Any) -> Iterable[torch.Tensor]:
    """The tensors an autograd node saved for its backward (its ``_saved_*`` attributes)."""
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        try:
            value = getattr(node, name)
        except Exception:  # noqa: BLE001 - freed, or not readable
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        yield from (v for v in values if isinstance(v, torch.Tensor))


def measure_eager_loss(loss: torch.Tensor, output_edges: Sequence[GradientEdge], *,
                       outputs_bytes: int, live_outputs: dict[int, int] | None = None,
                       alive_outputs: Sequence[torch.Tensor] = (),
                       exclude: Iterable[torch.Tensor] = (),
                       device: str | torch.device | None = None) -> EagerLoss:
    """Measure the eager code between the compiled forward and the backward on a real step.

    Call it where the backward is about to start (Lightning's ``on_before_backward``).
    ``output_edges``: the compiled forward's outputs as gradient edges
    (``torch.autograd.graph.get_gradient_edge``; the tensors themselves may be gone);
    ``outputs_bytes``: their bytes; ``live_outputs``: the storages of theirs still allocated now,
    ``{storage key: bytes}`` (a freed one's key may already name another storage: leave it out);
    ``alive_outputs``: the output tensors still referenced now; ``exclude``: tensors whose storages
    are counted elsewhere (parameters, the batch).

    Runs the loss's backward once, up to the outputs, with ``retain_graph=True`` (the gradients it
    makes are dropped; nothing is accumulated into ``.grad``).

    Raises:
        ValueError: ``loss`` has no autograd graph, or it does not reach any output edge.
    """
    if loss.grad_fn is None:
        raise ValueError("measure_eager_loss: the loss has no autograd graph (grad_fn is None)")
    stops = {id(e.node) for e in output_edges}
    excluded = {_compat.storage_key(t) for t in exclude}
    seen: set[int] = set()
    kept: dict[int, int] = {}
    reached = False
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in stops:
            reached = True
            continue
        for t in _saved_tensors(node):
            key = _compat.storage_key(t)
            if key not in excluded:
                kept[key] = int(t.untyped_storage().nbytes())
        stack.extend(n for n, _ in node.next_functions)
    if not reached:
        raise ValueError("measure_eager_loss: the loss does not depend on the compiled forward's outputs")
    for t in alive_outputs:
        kept.setdefault(_compat.storage_key(t), int(t.untyped_storage().nbytes()))
    outputs = live_outputs or {}
    outputs_kept = sum(b for k, b in kept.items() if k in outputs)
    edges = [e for e in output_edges if id(e.node) in seen]
    with PeakWindow(device) as window:
        grads = torch.autograd.grad(loss, edges, retain_graph=True, allow_unused=True)
    grad_bytes = sum({_compat.storage_key(g): int(g.untyped_storage().nbytes()) for g in grads
                      if g is not None}.values())
    del grads
    return EagerLoss(outputs_bytes=int(outputs_bytes), outputs_kept_bytes=int(outputs_kept),
                     kept_bytes=int(sum(kept.values()) - outputs_kept),
                     backward_peak_bytes=max(int(window.peak_bytes), grad_bytes), output_grad_bytes=grad_bytes)
