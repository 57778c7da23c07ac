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

import dataclasses
import gc
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from lightning_memplan._torch.storages import (
    held_tensors,
    local_tensor,
    storage_key,
    storage_weakref,
)
from lightning_memplan.forecasting.autograd_walk import (
    edges_reached,
    inner_edges,
    reach_down,
    saved_storage_keys,
    saved_tensors_of,
)
from lightning_memplan.measure import PeakWindow

__all__ = ["CallOutputs", "EagerCalls", "EagerLoss", "NotedOutputs", "eager_loss_events", "measure_eager_loss",
           "measure_eager_losses", "scaled_eager_loss"]


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
    #: Peak of all the eager code from the compiled forward's return to the backward's start (or
    #: to the next call of the forward) above the bytes live at that return: the loss's own
    #: forward, metrics updated on the outputs (a confusion matrix), logging. Its tensors that the
    #: loss keeps are in ``kept_bytes`` too; the rest is transient. Outputs freed in that code
    #: (a temporary output object: ``self.model(x).logits``) lower it. 0 when not measured.
    forward_peak_bytes: int = 0
    #: Whether ``forward_peak_bytes`` was measured; if not, the outputs are taken to live while
    #: the loss's kept tensors are made (the peak: outputs plus kept).
    forward_peak_measured: bool = False
    #: ``(storage key, bytes)`` of the outputs a later compiled region computes from (the logits
    #: a loss inside the model is computed on): in the forecast as that region's input, which
    #: dies in its backward. Keys identify storages while they live.
    inner_outputs: tuple[tuple[int, int], ...] = ()
    #: Of those, the bytes ``training_step`` returned: Lightning keeps them (detached) through the
    #: backward, so they do not die early (see ``Forecast.with_eager_loss``). Set by the caller.
    held_inner_bytes: int = 0
    #: Gradients of the trainable parameters that only the eager code reads (a head outside the
    #: planned submodule): the loss's backward makes them, after its peak, and they live on to the
    #: optimizer step. Parameters the forecast's graphs read are not counted here.
    param_grad_bytes: int = 0
    #: Outputs that require grad and that the loss does not reach, of a compiled region the loss
    #: does reach (``.logits`` and the KV cache beside ``.loss``): autograd hands that region's
    #: backward a tensor of zeros for each (``torch.autograd.Function`` materializes the missing
    #: gradients), as large as the output, live from the backward's start as its incoming gradient.
    zero_grad_bytes: int = 0
    #: The bytes of each of those outputs (they sum to ``zero_grad_bytes``; empty: not known apart).
    zero_grad_sizes: tuple[int, ...] = ()
    #: The bytes of each of the outputs' gradients the loss's backward ends with (they sum to
    #: ``output_grad_bytes``; empty: not known apart).
    output_grad_sizes: tuple[int, ...] = ()
    #: ``(storage key, bytes)`` of the outputs kept (in ``outputs_kept_bytes``) because the loss's
    #: autograd nodes saved them (``F.nll_loss`` keeps its input): they die as the loss's backward
    #: runs, before the compiled backward, unless ``training_step`` returned them (Lightning keeps
    #: those through the backward: :func:`~lightning_memplan.callback.first_batch.held_returned`
    #: drops them from here). Keys identify storages while they live.
    saved_outputs: tuple[tuple[int, int], ...] = ()
    #: ``(region, bytes)`` of the outputs an earlier compiled region of the call returned straight
    #: to the eager code (the KV cache beside the logits a loss region reads) and that died there,
    #: each storage once; ``region``: its place among the call's compiled regions, in the order
    #: they ran. Not in ``outputs_bytes``: the forecast holds them as that region's outputs, and
    #: :func:`~lightning_memplan.forecasting.layout.lay_out` frees them after the eager code.
    early_outputs: tuple[tuple[int, int], ...] = ()
    #: How many compiled regions the call ran (0: not known). :attr:`early_outputs` name places
    #: among them; a forecast whose call runs another number of regions counts them as outputs.
    regions: int = 0

    @property
    def early_outputs_bytes(self) -> int:
        """Bytes of :attr:`early_outputs`."""
        return sum(b for _, b in self.early_outputs)

    def with_outputs_held_by(self, place: int) -> EagerLoss:
        """This measurement for a forecast whose call ends in one compiled region more than the
        measured call ran: the stand-in loss, compiled on its own after a graph break (the model's
        last module compiled on its own, as regional compilation does). The call's outputs are then
        region ``place``'s outputs in the forecast, held there: those the loss did not keep die in
        the eager code (:attr:`early_outputs`), the kept ones live on as that region's outputs
        until its backward; none is counted again as an output of the call."""
        dropped = self.outputs_bytes - self.outputs_kept_bytes
        return dataclasses.replace(self, outputs_bytes=0, outputs_kept_bytes=0, saved_outputs=(),
                                   early_outputs=(*self.early_outputs, *(((place, dropped),) if dropped > 0 else ())),
                                   regions=self.regions + 1)

    def with_early_outputs_counted(self) -> EagerLoss:
        """This measurement with :attr:`early_outputs` counted as outputs freed in the eager code
        (for a forecast that lays the call out in another number of regions)."""
        if not self.early_outputs:
            return self
        return dataclasses.replace(self, outputs_bytes=self.outputs_bytes + self.early_outputs_bytes,
                                   early_outputs=())

    @property
    def saved_outputs_bytes(self) -> int:
        """Bytes of :attr:`saved_outputs`."""
        return sum(b for _, b in self.saved_outputs)


def scaled_eager_loss(loss: EagerLoss, ratio: float) -> EagerLoss:
    """``loss`` as it would measure on outputs ``ratio`` times as large (a batch of other input
    shapes: longer sequences, more rows): every byte count that follows the outputs' size is
    scaled and rounded; the gradients of parameters only the eager code reads
    (``param_grad_bytes``) do not depend on the batch and are kept. Exact for a loss, metric or
    head whose tensors are each as large as the outputs times a constant (cross-entropy, MSE);
    a part of fixed size (a confusion matrix) is scaled with the rest.

    Raises:
        ValueError: ``ratio`` is not a finite number > 0.
    """
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"scaled_eager_loss: ratio={ratio!r} must be a finite number > 0")

    def s(n: int) -> int:
        return int(round(n * ratio))

    return EagerLoss(
        outputs_bytes=s(loss.outputs_bytes), outputs_kept_bytes=min(s(loss.outputs_kept_bytes), s(loss.outputs_bytes)),
        kept_bytes=s(loss.kept_bytes), backward_peak_bytes=s(loss.backward_peak_bytes),
        output_grad_bytes=s(loss.output_grad_bytes), forward_peak_bytes=s(loss.forward_peak_bytes),
        forward_peak_measured=loss.forward_peak_measured,
        inner_outputs=tuple((k, s(n)) for k, n in loss.inner_outputs), held_inner_bytes=s(loss.held_inner_bytes),
        param_grad_bytes=loss.param_grad_bytes, zero_grad_bytes=s(loss.zero_grad_bytes),
        zero_grad_sizes=tuple(s(n) for n in loss.zero_grad_sizes),
        output_grad_sizes=tuple(s(n) for n in loss.output_grad_sizes),
        saved_outputs=tuple((k, s(n)) for k, n in loss.saved_outputs),
        early_outputs=tuple((r, s(n)) for r, n in loss.early_outputs), regions=loss.regions)


def eager_loss_events(loss: EagerLoss, last: int) -> dict[tuple[str, int, str], list[tuple[str, str, int]]]:
    """Layout events (``forecasting.layout.lay_out``'s ``overlay``: ``(name, category, bytes)`` at
    ``("fw" | "bw", position, "before" | "after")``) for ``loss`` around position ``last``, the
    step's last compiled region:

    - after its forward: the eager code's peak (the outputs plus ``forward_peak_bytes`` when
      measured, at least the outputs kept plus the loss's kept tensors; else the outputs plus the
      kept tensors), then down to what lives when the backward starts (the kept tensors and the
      outputs kept);
    - before its backward: the loss's backward peak (the outputs' gradients it ends with
      included), then all of it but those gradients freed with the kept tensors and the outputs
      only the loss's nodes kept (``saved_outputs``);
    - after its backward: the other kept outputs freed (taken to live through the whole region's
      backward);
    - the gradients of the parameters only the eager code reads (``param_grad_bytes``), made at the
      end of the loss's backward, category ``"gradients"``, never freed in the step.

    The outputs' gradients themselves are handed to the region's backward and die at its last read
    of its incoming gradient: ``lay_out``'s ``bw_hold`` (``output_grad_bytes``), not an event here.
    Category ``"activations"`` but for those gradients. The events sum to ``param_grad_bytes``.
    """
    a = "activations"
    saved_out = min(loss.saved_outputs_bytes, loss.outputs_kept_bytes)
    left = loss.outputs_kept_bytes + loss.kept_bytes  # live when the backward starts
    made = loss.forward_peak_bytes if loss.forward_peak_measured else loss.kept_bytes
    top = max(loss.outputs_bytes + made, left)
    forward = [("eager_loss_forward", a, top)]
    if top > left:
        forward.append(("eager_forward_freed", a, left - top))
    return {
        ("fw", last, "after"): forward,
        ("bw", last, "before"): [("eager_loss_backward", a, loss.backward_peak_bytes),
                                 ("eager_loss_backward_end", a,
                                  -loss.backward_peak_bytes - loss.kept_bytes - saved_out),
                                 *([("eager_parameter_gradients", "gradients", loss.param_grad_bytes)]
                                   if loss.param_grad_bytes else [])],
        ("bw", last, "after"): [("eager_outputs_freed_after_backward", a, saved_out - loss.outputs_kept_bytes)],
    }


@dataclass(frozen=True)
class CallOutputs:
    """One call of the compiled forward, as seen when it returned (nothing here keeps its outputs
    alive, except ``alive``, taken just before measuring)."""

    #: Its outputs as gradient edges (``torch.autograd.graph.get_gradient_edge``).
    edges: Sequence[GradientEdge]
    #: Bytes of its outputs (every storage once).
    outputs_bytes: int
    #: Its output storages still allocated when measuring, ``{storage key: bytes}`` (a freed one's
    #: key may already name another storage: leave it out).
    live_outputs: dict[int, int] = field(default_factory=dict)
    #: Its output tensors still referenced when measuring.
    alive: Sequence[torch.Tensor] = ()
    #: Measured peak of the eager code after it (:attr:`EagerLoss.forward_peak_bytes`), in bytes.
    forward_peak_bytes: int = 0
    #: Whether :attr:`forward_peak_bytes` was measured.
    forward_peak_measured: bool = False
    #: Storage key and bytes of each edge's tensor when the call returned (aligned with ``edges``;
    #: empty: unknown). An output another output is computed from (the logits a loss inside the
    #: model is computed on, after a graph break) is an input of a later compiled region, held in
    #: the forecast already: it is not counted again.
    edge_keys: Sequence[int] = ()
    edge_bytes: Sequence[int] = ()
    #: The compiled region (its place among the call's regions, in the order they ran) whose
    #: output each edge is (aligned with ``edges``; -1: none known); empty: unknown.
    edge_regions: Sequence[int] = ()
    #: How many compiled regions the call ran (0: not known).
    regions: int = 0


@dataclass
class NotedOutputs:
    """A call's outputs noted when it returned (:meth:`of`), holding nothing that keeps them alive:
    their gradient edges, weak references to their storages (with bytes) and to the tensors. The
    peak of the eager code after the call is filled in when its window closes."""

    edges: list[GradientEdge]
    #: ``(StorageWeakRef, bytes)`` per output storage (each once).
    storages: list[tuple[Any, int]]
    refs: list[Any]
    #: Storage key and bytes of each edge's tensor (aligned with ``edges``).
    edge_keys: list[int] = field(default_factory=list)
    edge_bytes: list[int] = field(default_factory=list)
    #: :attr:`EagerLoss.forward_peak_bytes` of this call, in bytes.
    forward_peak_bytes: int = 0
    #: Whether :attr:`forward_peak_bytes` was measured (its window closed).
    forward_peak_measured: bool = False
    #: Per storage key, ``time.time_ns()`` when the last of its noted tensors died (a tensor dies
    #: when nothing refers to it any more: no Python name, view or tensor saved for backward).
    died: dict[int, int] = field(default_factory=dict)
    #: :attr:`CallOutputs.edge_regions` (aligned with ``edges``; empty: unknown).
    edge_regions: list[int] = field(default_factory=list)
    #: :attr:`CallOutputs.regions`.
    regions: int = 0

    @classmethod
    def of(cls, out: Any) -> NotedOutputs:
        """Note the tensors in ``out`` (any nesting of tuples, lists and dicts)."""
        import weakref

        from torch.autograd.graph import get_gradient_edge

        leaves = list({id(t): t for t in held_tensors(out)}.values())  # each tensor once
        storages = {storage_key(t): t for t in leaves}
        grad = [t for t in leaves if t.requires_grad]
        died: dict[int, int] = {}

        def death(key: int) -> Callable[[Any], None]:
            return lambda _: died.__setitem__(key, time.time_ns())

        return cls(edges=[get_gradient_edge(t) for t in grad],
                   storages=[(storage_weakref(t), int(t.untyped_storage().nbytes()))
                             for t in storages.values()],
                   refs=[weakref.ref(t, death(storage_key(t))) for t in leaves],
                   edge_keys=[storage_key(t) for t in grad],
                   edge_bytes=[int(t.untyped_storage().nbytes()) for t in grad], died=died)

    def freed_since(self, start_ns: int) -> list[tuple[int, int]]:
        """``(time_ns, bytes)`` of each output storage freed since ``start_ns`` (``time.time_ns()``):
        gone now, its last noted tensor dead at or after ``start_ns``; the time is that death."""
        # a weak reference's cdata is its storage's key, and stays so once the storage is gone
        return [(self.died[ref.cdata], n) for ref, n in self.storages
                if ref.expired() and self.died.get(ref.cdata, -1) >= start_ns]

    def now(self) -> CallOutputs:
        """What is left of them now, for :func:`measure_eager_losses`."""
        return CallOutputs(edges=self.edges, outputs_bytes=sum(n for _, n in self.storages),
                           # storages still allocated (a freed one's key may already be reused)
                           live_outputs={ref.cdata: n for ref, n in self.storages if not ref.expired()},
                           alive=[t for t in (r() for r in self.refs) if t is not None],
                           forward_peak_bytes=self.forward_peak_bytes,
                           forward_peak_measured=self.forward_peak_measured, edge_keys=tuple(self.edge_keys),
                           edge_bytes=tuple(self.edge_bytes), edge_regions=tuple(self.edge_regions),
                           regions=self.regions)


class EagerCalls:
    """The calls of the compiled forward in one step, each noted when it returned
    (:class:`NotedOutputs`), with a :class:`~lightning_memplan.measure.PeakWindow` on the eager code
    after each: from its return (:meth:`returned`) to :meth:`close` (called before the next call
    and where the backward starts); its peak is that call's ``forward_peak_bytes``."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = device
        self.calls: list[NotedOutputs] = []
        self._window: PeakWindow | None = None
        # the last compiled region's outputs inside the running call
        self._tentative: NotedOutputs | None = None
        # (node id, output_nr) of every compiled region's outputs inside the running call
        self._region_edges: set[tuple[int, int]] = set()
        # autograd node id -> place of the compiled region (of the running call) it belongs to
        self._region_nodes: dict[int, int] = {}
        self._regions = 0

    def region_returned(self, out: Any) -> None:
        """A compiled region inside the running call returned ``out``: note it in place of the
        region before (see :meth:`returned_after_regions`). No window opens here: on CPU a window is
        the profiler, and starting and stopping it at every region of a forward crashed the process
        now and then."""
        self._tentative = note = NotedOutputs.of(out)
        self._region_edges.update((id(e.node), e.output_nr) for e in note.edges)
        for e in note.edges:
            self._region_nodes.setdefault(id(e.node), self._regions)
        self._regions += 1

    def discard_regions(self) -> None:
        """Drop the notes of :meth:`region_returned`, if any."""
        self._region_edges = set()
        self._tentative = None
        self._region_nodes = {}
        self._regions = 0

    def returned_after_regions(self, out: Any) -> None:
        """The call returned ``out``. If eager code ran after its last compiled region (an output
        that requires grad is none of the call's compiled regions' outputs: a head or a loss inside
        a forward whose frame dynamo skipped), note the last region's outputs as the call's, so the
        eager end of the forward is measured with the loss (what it keeps, its backward; its
        transients inside the forward are not: the window opens at the return, as in
        :meth:`returned`); else note ``out`` (:meth:`returned`)."""
        from torch.autograd.graph import get_gradient_edge

        edges, note, nodes, regions = self._region_edges, self._tentative, self._region_nodes, self._regions
        self.discard_regions()
        if note is not None and note.edges:
            grads = [t for t in held_tensors(out) if t.requires_grad]
            if any((id(e.node), e.output_nr) not in edges for e in map(get_gradient_edge, grads)):
                self._append(note)
                return
        note = NotedOutputs.of(out)
        if regions:
            note.edge_regions = [nodes.get(id(e.node), -1) for e in note.edges]
            note.regions = regions
        self._append(note)

    def returned(self, out: Any) -> None:
        """A call returned ``out``: note it and open the window on the eager code after it."""
        self._append(NotedOutputs.of(out))

    def _append(self, note: NotedOutputs) -> None:
        """End the open window, add ``note`` as the next call and open a window from now."""
        self.close()
        self.calls.append(note)
        self._window = PeakWindow(self.device)
        self._window.__enter__()

    def close(self) -> None:
        """End the open window, if any; its peak goes with the last call."""
        self.discard_regions()
        window, self._window = self._window, None
        if window is None:
            return
        note = self.calls[-1]
        for at, nbytes in note.freed_since(window.opened_ns):  # unseen by the CPU profiler
            window.note_free(nbytes, at)
        window.__exit__(None, None, None)
        note.forward_peak_bytes = int(window.peak_bytes)
        note.forward_peak_measured = True

    def now(self) -> list[CallOutputs]:
        """What is left of every call's outputs now, for :func:`measure_eager_losses`. Garbage
        reference cycles are collected first: in the step that compiled, dynamo's trackers of an
        output object (a ``DynamicCache``) hold its tensors in cycles, which no later step has."""
        gc.collect()
        return [c.now() for c in self.calls]


def measure_eager_losses(loss: torch.Tensor, calls: Sequence[CallOutputs], *,
                         exclude: Iterable[torch.Tensor] = (),
                         forecast_params: Iterable[torch.Tensor] = (),
                         device: str | torch.device | None = None) -> tuple[EagerLoss, ...]:
    """Measure the eager code between the compiled forward's calls and the backward on a real
    step, one :class:`EagerLoss` per call (in call order).

    Call it where the backward is about to start (Lightning's ``on_before_backward``). ``exclude``:
    tensors whose storages are counted elsewhere (parameters, the batch); ``forecast_params``: the
    parameters whose gradients the forecast counts (the planned module's): the gradients of the
    other trainable parameters the loss's graph reaches are :attr:`EagerLoss.param_grad_bytes`
    (of the call that owns their node, as saved tensors are). The loss's autograd
    nodes are walked down to the calls' outputs: a node's saved tensors belong to the last call
    whose outputs it reaches (a term of one call's loss: that call; a term that combines several
    calls, or none: the last), each storage once. Each call's part of the loss's backward is run
    once, up to its outputs, with ``retain_graph=True`` (the gradients it makes are dropped;
    nothing is accumulated into ``.grad``).

    Raises:
        ValueError: ``calls`` is empty, ``loss`` has no autograd graph, or it reaches no call's outputs.
    """
    if not calls:
        raise ValueError("measure_eager_losses: `calls` is empty; pass one CallOutputs per call of the forward")
    if loss.grad_fn is None:
        raise ValueError("measure_eager_loss: the loss has no autograd graph (grad_fn is None)")
    stops = {id(e.node): c for c, call in enumerate(calls) for e in call.edges}
    nodes, reach = reach_down(loss.grad_fn, stops)
    if not any(k in nodes for k in stops):
        raise ValueError("measure_eager_loss: the loss does not depend on the compiled forward's outputs")
    inner = inner_edges([e for c in calls for e in c.edges])
    sent = edges_reached(loss, nodes, stops)
    # per call: output storages a later compiled region takes as its input (in the forecast already)
    held = [{k: b for e, k, b in zip(c.edges, c.edge_keys, c.edge_bytes) if (id(e.node), e.output_nr) in inner}
            for c in calls]
    # per call: outputs its compiled region also saved for its backward (a KV cache's keys and
    # values): saved activations in the forecast already, not outputs to count again
    saved_out = [{k: b for k, b in zip(c.edge_keys, c.edge_bytes) if k in saved and k not in h}
                 for c, h, saved in zip(calls, held, (saved_storage_keys(c.edges) for c in calls))]
    # per call: outputs an earlier region returned straight to the eager code (not saved, not
    # read by a later region): in the forecast as that region's outputs, {key: (region, bytes)}
    early = [{k: (r, b) for k, b, r in zip(c.edge_keys, c.edge_bytes, c.edge_regions)
              if 0 <= r < c.regions - 1 and k not in h and k not in so}
             for c, h, so in zip(calls, held, saved_out)]
    excluded = {storage_key(t) for t in exclude}.union(*(s.keys() for s in saved_out)).union(
        *({k for k in h if k in c.live_outputs} for h, c in zip(held, calls))).union(
        *(e.keys() for e in early))
    last = len(calls) - 1
    planned = {id(p) for p in forecast_params}
    kept: dict[int, tuple[int, int]] = {}  # storage -> (call, bytes)
    param_grads = [0] * len(calls)
    for key, node in nodes.items():
        if key in stops:
            continue
        owner = max(reach[key], default=last)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf's gradient
        if isinstance(variable, torch.Tensor) and variable.requires_grad and id(variable) not in planned:
            local = local_tensor(variable)
            param_grads[owner] += int(local.numel() * local.element_size())
        for t in saved_tensors_of(node):
            s = storage_key(t)
            if s not in excluded:
                kept.setdefault(s, (owner, int(t.untyped_storage().nbytes())))
    by_nodes = set(kept)  # storages the loss's nodes saved (an output also referenced is one too)
    for c, call in enumerate(calls):
        for t in call.alive:
            if storage_key(t) not in excluded:
                kept.setdefault(storage_key(t), (c, int(t.untyped_storage().nbytes())))
    out: list[EagerLoss] = []
    for c, call in enumerate(calls):
        mine = {s: b for s, (owner, b) in kept.items() if owner == c}
        outputs_kept = sum(b for s, b in mine.items() if s in call.live_outputs)
        saved_outputs = tuple((s, b) for s, b in mine.items() if s in call.live_outputs and s in by_nodes)
        edges = [e for e in call.edges if id(e.node) in nodes]
        # outputs of a region whose backward runs that get no gradient: autograd passes zeros
        zeros = {k: b for e, k, b in zip(call.edges, call.edge_keys, call.edge_bytes)
                 if id(e.node) in nodes and (id(e.node), e.output_nr) not in sent
                 and (id(e.node), e.output_nr) not in inner}
        grad_bytes = peak = 0
        grad_sizes: tuple[int, ...] = ()
        if edges:
            with PeakWindow(device) as window:
                grads = torch.autograd.grad(loss, edges, retain_graph=True, allow_unused=True)
            sizes = {storage_key(g): int(g.untyped_storage().nbytes()) for g in grads if g is not None}
            grad_bytes = sum(sizes.values())
            grad_sizes = tuple(sizes.values())
            peak = int(window.peak_bytes)
            del grads
        early_bytes = sum(b for _, b in early[c].values())
        out.append(EagerLoss(outputs_bytes=int(call.outputs_bytes) - sum(held[c].values()) - sum(saved_out[c].values())
                             - early_bytes,
                             outputs_kept_bytes=int(outputs_kept),
                             kept_bytes=int(sum(mine.values()) - outputs_kept),
                             backward_peak_bytes=max(peak, grad_bytes), output_grad_bytes=grad_bytes,
                             forward_peak_bytes=int(call.forward_peak_bytes),
                             forward_peak_measured=call.forward_peak_measured,
                             inner_outputs=tuple(sorted(held[c].items())), param_grad_bytes=param_grads[c],
                             zero_grad_bytes=int(sum(zeros.values())), zero_grad_sizes=tuple(zeros.values()),
                             output_grad_sizes=grad_sizes, saved_outputs=saved_outputs,
                             # those still live are held to their region's backward, as forecast
                             early_outputs=tuple(sorted(v for k, v in early[c].items()
                                                        if k not in call.live_outputs)),
                             regions=call.regions))
    return tuple(out)


def measure_eager_loss(loss: torch.Tensor, output_edges: Sequence[GradientEdge], *,
                       outputs_bytes: int, live_outputs: dict[int, int] | None = None,
                       alive_outputs: Sequence[torch.Tensor] = (),
                       exclude: Iterable[torch.Tensor] = (),
                       device: str | torch.device | None = None,
                       forward_peak_bytes: int = 0) -> EagerLoss:
    """Measure the eager code between the compiled forward and the backward on a real step, for
    a step that calls the forward once (:func:`measure_eager_losses` with one call).

    Call it where the backward is about to start (Lightning's ``on_before_backward``).
    ``output_edges``: the compiled forward's outputs as gradient edges
    (``torch.autograd.graph.get_gradient_edge``; the tensors themselves may be gone);
    ``outputs_bytes``: their bytes; ``live_outputs``: the storages of theirs still allocated now,
    ``{storage key: bytes}`` (a freed one's key may already name another storage: leave it out);
    ``alive_outputs``: the output tensors still referenced now; ``exclude``: tensors whose storages
    are counted elsewhere (parameters, the batch); ``forward_peak_bytes``: the eager code's peak
    after the forward, if measured (:attr:`EagerLoss.forward_peak_bytes`).

    Runs the loss's backward once, up to the outputs, with ``retain_graph=True`` (the gradients it
    makes are dropped; nothing is accumulated into ``.grad``).

    Raises:
        ValueError: ``loss`` has no autograd graph, or it does not reach any output edge.
    """
    call = CallOutputs(edges=tuple(output_edges), outputs_bytes=int(outputs_bytes),
                       live_outputs=dict(live_outputs or {}), alive=tuple(alive_outputs),
                       forward_peak_bytes=int(forward_peak_bytes))
    (measured,) = measure_eager_losses(loss, [call], exclude=exclude, device=device)
    return measured
