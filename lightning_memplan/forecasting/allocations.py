"""The ordered allocations and frees of one training step, and what the CUDA caching allocator makes of them.

A forecast predicts bytes *requested* (the sum of the live storages' sizes). The CUDA caching
allocator hands out *blocks*: rounded to 512 bytes, and a large free block whose remainder would be
1 MiB or less is handed out whole. ``torch.cuda.max_memory_allocated`` counts blocks, so on CUDA it
is above the requested peak, by an amount that depends on the order and sizes of the allocations.
This module keeps that order:

* :class:`GraphTrace` is one graph's run: the counted inputs live at its start and its events, with
  keys local to the producer (the FX memory replay or the inductor wrapper replay).
* :func:`stitch_step` lays the graphs of a step out as the forecast's timeline does (forwards in
  order, backwards in reverse, then the optimizer), giving every storage one key: saved activations
  are the forward's own blocks, a region's incoming gradients are the ones the next region's backward
  returned, gradients die at ``zero_grad``.
* :func:`share_inputs` makes a graph's inputs that are views of one storage one allocation.
* :func:`lightning_order` moves ``zero_grad`` before the backward, as Lightning's automatic
  optimization runs it.
* :func:`simulate_cuda_allocator` replays the step through
  :class:`~lightning_memplan.core.cuda_allocator.CachingAllocatorModel` in the order a run allocates
  (baseline, compiling run, first step, steps until they repeat) and reports the allocated and
  reserved peaks of the next one.

Pure functions on plain data; all sizes in bytes. Invariant checked by the tests: the running sum of a
stitched step's events peaks at the forecast's ``requested`` peak (:attr:`StepAllocations.requested_peak_bytes`).
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from lightning_memplan.core.cuda_allocator import CachingAllocatorModel
from lightning_memplan.core.peaks import running_peak

__all__ = ["AllocEvent", "AllocatorForecast", "GraphTrace", "RegionTrace", "StepAllocations", "accumulation_order",
           "lightning_order", "share_inputs", "simulate_cuda_allocator", "stitch_step"]


class AllocEvent(NamedTuple):
    """One allocation or free of a storage (``nbytes`` bytes, also given on the free)."""

    op: Literal["alloc", "free"]
    key: Hashable
    nbytes: int
    #: Device type of the storage (``"cuda"``, ``"cpu"``, ...).
    device: str


@dataclass(frozen=True, kw_only=True)
class GraphTrace:
    """The allocations of one graph run, keys local to its producer.

    ``events`` allocate and free storages in execution order; a free whose key was never allocated in
    the trace frees an input (see ``inputs``). Storages still live after the last event are the
    graph's results (outputs, saved activations).
    """

    #: Counted inputs live when the graph starts, as alloc events (keys the events may free).
    inputs: tuple[AllocEvent, ...] = ()
    #: Which of ``inputs`` are incoming gradients (tangents); the others are saved activations.
    tangent_keys: frozenset[Hashable] = frozenset()
    events: tuple[AllocEvent, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RegionTrace:
    """One compiled region: its forward, its backward (``None`` for an inference graph), and the
    transient contiguous copy of a non-contiguous gradient right after the backward (bytes)."""

    forward: GraphTrace
    backward: GraphTrace | None
    grad_copy: int = 0
    #: Whether the backward keeps one of the forward's activation inputs; when not, the previous
    #: region's outputs die once this forward has run (see :func:`stitch_step`).
    keeps_inputs: bool = True
    #: Whether the backward keeps one of the inputs the eager code before this region made
    #: (``fresh`` of :func:`stitch_step`); when not, they die once the last forward has run.
    keeps_glue: bool = True
    #: Bytes of the backward's results that are parameters' gradients (the others are the
    #: gradients of its activation inputs, handed to the previous region).
    param_gradients: int = 0


@dataclass(frozen=True, kw_only=True)
class StepAllocations:
    """The allocations of one training step with global keys, and what was live before it."""

    #: Sizes in bytes of the storages live before the step (parameters, buffers, inputs, optimizer
    #: state), in allocation order, with their device types.
    baseline: tuple[tuple[int, str], ...]
    #: The step's events; every storage the step allocates is freed by its end (after
    #: :func:`lightning_order`, its new gradients stay live into the next step instead).
    events: tuple[AllocEvent, ...]
    #: ``events[start:stop]`` are the optimizer step's temporaries; ``None`` without an optimizer.
    optimizer_span: tuple[int, int] | None = None
    #: Optimizer state the *first* step creates (bytes, device type), when the optimizer had none
    #: yet: allocated at the start of that step's optimizer step, then live for good.
    new_state: tuple[tuple[int, str], ...] = ()
    #: Index of the first backward event (``len(events)`` when nothing runs backward).
    backward_start: int | None = None
    #: ``events[start:stop]`` free the gradients (``zero_grad`` after the optimizer step).
    zero_grad_span: tuple[int, int] | None = None

    @property
    def requested_peak_bytes(self) -> int:
        """Highest sum of the step's live storages (bytes above the baseline), every device."""
        return running_peak([e.nbytes if e.op == "alloc" else -e.nbytes for e in self.events])


@dataclass(frozen=True, kw_only=True)
class AllocatorForecast:
    """What the CUDA caching allocator reports for one steady-state step (bytes).

    Invariant: ``reserved_peak_bytes >= allocated_max_bytes >= baseline_allocated_bytes``.
    """

    #: ``max_memory_allocated`` during the step minus ``memory_allocated`` at its start (blocks).
    allocated_peak_bytes: int
    #: The same for the requested sizes (no rounding): the forecast's own peak on this device.
    requested_peak_bytes: int
    #: ``max_memory_allocated`` during the step (blocks, the baseline's included).
    allocated_max_bytes: int
    #: ``memory_reserved`` after the measured step: the segments this run needs (it only grows
    #: without ``empty_cache``), starting from an empty cache.
    reserved_peak_bytes: int
    #: Blocks allocated before the step (the baseline, rounded).
    baseline_allocated_bytes: int
    #: Steps replayed before the measured one (the first creates the optimizer state).
    warmup_steps: int
    #: Device type simulated.
    device: str


def share_inputs(
    events: Sequence[AllocEvent],
    marks: Sequence[int],
    owner: dict[Hashable, Hashable | None],
    sizes: dict[Hashable, int],
) -> tuple[list[AllocEvent], list[int], list[int]]:
    """Merge a graph's input allocations that are one storage at run time.

    A graph replay that allocates each input on its own counts twice an input that is a view of
    another input's storage, or of a storage allocated elsewhere (a primal). ``owner`` maps an
    input's key to its storage (``None``: allocated by nobody here, never counted); inputs of one
    storage become one allocation of ``sizes[storage]`` bytes under the first input's key, freed
    when the last of them is freed. Other events pass through.

    ``marks[i]`` counts the events before step ``i``; returns the new events, the marks into them,
    and the bytes live at each mark (the running sum).
    """
    first: dict[Hashable, Hashable] = {}
    pending: dict[Hashable, set[Hashable]] = {}
    for key, storage in owner.items():
        if storage is not None:
            first.setdefault(storage, key)
            pending.setdefault(storage, set()).add(key)
    out: list[AllocEvent] = []
    new_marks: list[int] = []
    timeline: list[int] = []
    cur = 0
    mark_at = iter(marks)
    nxt = next(mark_at, None)
    for i in range(len(events) + 1):
        while nxt is not None and nxt == i:
            new_marks.append(len(out))
            timeline.append(cur)
            nxt = next(mark_at, None)
        if i == len(events):
            break
        e = events[i]
        if e.key not in owner:
            out.append(e)
            cur += e.nbytes if e.op == "alloc" else -e.nbytes
            continue
        storage = owner[e.key]
        if storage is None:
            continue
        size = sizes[storage]
        if e.op == "alloc":
            if first[storage] == e.key:
                out.append(AllocEvent("alloc", e.key, size, e.device))
                cur += size
        else:
            pending[storage].discard(e.key)
            if not pending[storage]:
                out.append(AllocEvent("free", first[storage], size, e.device))
                cur -= size
    return out, new_marks, timeline


def _free_all(out: list[AllocEvent], live: dict[int, AllocEvent], keys: Iterable[int]) -> None:
    for g in list(keys):
        e = live.pop(g, None)
        if e is not None:
            out.append(AllocEvent("free", g, e.nbytes, e.device))


def _take(pool: list[int], live: dict[int, AllocEvent], nbytes: int, device: str) -> int | None:
    """Remove and return the first live key of ``pool`` with this size and device."""
    for i, g in enumerate(pool):
        e = live.get(g)
        if e is not None and e.nbytes == nbytes and e.device == device:
            del pool[i]
            return g
    return None


def held_past(forward_freed: Mapping[int, Mapping[int, int]] | None, j: int) -> frozenset[int]:
    """Positions whose outputs eager code was seen holding past position ``j``'s forward (a frame
    that names them, as a causal LM's ``hidden_states`` through its loss): ``forward_freed``, as
    :func:`stitch_step` takes it, has them die after a later forward."""
    return frozenset(i for k, by in (forward_freed or {}).items() if k > j for i in by)


def stitch_step(
    regions: Sequence[RegionTrace], optimizer: Sequence[AllocEvent] | None = None,
    forward_freed: Mapping[int, Mapping[int, int]] | None = None, fresh: Sequence[int] = (),
    fresh_saved: Sequence[int] = (),
) -> StepAllocations:
    """One training step's events with global (int) keys, laid out as the forecast's timeline.

    Forwards run in order; a forward's results stay live. Backwards run in reverse: region ``r``'s
    saved activations are its forward's results (same key, else same size and device); its other
    forward results (the outputs region ``r + 1`` consumed) are freed when its backward starts,
    except in the last region (the loss stays), or as soon as region ``r + 1``'s forward has run
    when that region keeps none of its activation inputs (``keeps_inputs``) and eager code was not
    seen holding them longer (:func:`held_past`). Its incoming gradients
    are the blocks the previous backward returned (same size), else allocated fresh at the start
    (the loss's gradient). A backward's new results are gradients; they live until ``zero_grad``
    after the ``optimizer`` events (local keys), or until the step ends. A returned block no
    incoming gradient matches was consumed by uncompiled code between the two regions: it dies when
    the backward starts, as long as the blocks taken over stay within the smaller of the incoming
    gradients' bytes and the returned activations' gradients' (``param_gradients`` excluded).
    ``forward_freed[j]``: ``{i: bytes}`` of region ``i``'s outputs the eager code after region
    ``j``'s forward dropped (as :func:`~lightning_memplan.forecasting.layout.lay_out` takes it): its
    outputs, largest first, up to those bytes, are freed there.
    ``fresh[j]``: bytes made just before region ``j``'s forward (as ``inputs`` of ``lay_out``),
    freed after its backward, or after the last forward when its backward keeps none of them
    (``keeps_glue``); ``fresh_saved[j]`` of them (what the eager ops that made them saved for
    their backward) after its backward in any case.
    Everything still live at the end is freed. ``regions`` are in the order the step runs them, once
    per call.

    Returns the step with an empty baseline, and where its backward, optimizer and ``zero_grad`` are.
    """
    ids = itertools.count()
    out: list[AllocEvent] = []
    live: dict[int, AllocEvent] = {}

    def alloc(e: AllocEvent) -> int:
        g = next(ids)
        ev = AllocEvent("alloc", g, e.nbytes, e.device)
        live[g] = ev
        out.append(ev)
        return g

    def run(events: Iterable[AllocEvent], mapping: dict[Hashable, int]) -> None:
        for e in events:
            if e.op == "alloc":
                mapping[e.key] = alloc(e)
            else:
                g = mapping.pop(e.key, None)
                if g is not None:
                    _free_all(out, live, (g,))

    def saved_of(r: RegionTrace, results: dict[Hashable, int]) -> tuple[dict[Hashable, int | None], list[int]]:
        """Match ``r``'s backward's saved inputs to its forward's live results (same key, else same
        size and device): ``{input key: global key or None}``, and the results left (its outputs)."""
        assert r.backward is not None
        unmatched = [g for g in results.values() if g in live]
        found: dict[Hashable, int | None] = {}
        for e in r.backward.inputs:
            if e.key in r.backward.tangent_keys:
                continue
            g = results.get(e.key)
            if g is not None and g in unmatched:
                unmatched.remove(g)
            else:
                g = _take(unmatched, live, e.nbytes, e.device)
            found[e.key] = g
        return found, unmatched

    fw_results: list[dict[Hashable, int]] = []
    matched: dict[int, dict[Hashable, int | None]] = {}  # regions whose outputs died early
    left: dict[int, list[int]] = {}  # of those, the outputs not freed yet
    glue_keys: dict[int, int] = {}  # region -> the key of its fresh bytes (but those saved)
    saved_keys: dict[int, int] = {}  # region -> the key of the fresh bytes eager ops saved
    for j, r in enumerate(regions):
        made = fresh[j] if j < len(fresh) else 0
        kept = min(made, fresh_saved[j] if j < len(fresh_saved) else 0)
        device = next((e.device for e in (*r.forward.inputs, *r.forward.events)), "cuda") if made else "cuda"
        if made > kept:
            glue_keys[j] = alloc(AllocEvent("alloc", None, made - kept, device))
        if kept:
            saved_keys[j] = alloc(AllocEvent("alloc", None, kept, device))
        mapping: dict[Hashable, int] = {e.key: alloc(e) for e in r.forward.inputs}
        run(r.forward.events, mapping)
        fw_results.append(mapping)
        prev = regions[j - 1] if j else None
        if (prev is not None and prev.backward is not None and not r.keeps_inputs
                and j - 1 not in held_past(forward_freed, j)):
            # this backward keeps none of its activation inputs: the previous outputs die now
            if j - 1 not in matched:
                matched[j - 1], left[j - 1] = saved_of(prev, fw_results[j - 1])
            _free_all(out, live, left[j - 1])
            left[j - 1] = []
        for i, nbytes in (forward_freed or {}).get(j, {}).items():
            if i > j or regions[i].backward is None:
                continue
            if i not in matched:
                matched[i], left[i] = saved_of(regions[i], fw_results[i])
            for g in sorted(left[i], key=lambda g: -live[g].nbytes if g in live else 0):
                if g in live and live[g].nbytes <= nbytes:
                    nbytes -= live[g].nbytes
                    left[i].remove(g)
                    _free_all(out, live, (g,))

    for j, r in enumerate(regions):
        if j in glue_keys and not r.keeps_glue:  # only the eager code referred to them: gone before the backward
            _free_all(out, live, (glue_keys.pop(j),))
    grads: list[int] = []  # every gradient still live
    returned: list[int] = []  # what the previous backward returned
    returned_params = 0  # bytes of it that are parameters' gradients
    backward_start = len(out)
    for i, (r, results) in enumerate(zip(reversed(regions), reversed(fw_results))):
        bw = r.backward
        last = i == 0
        if bw is None:
            continue
        mapping = {}
        k = len(regions) - 1 - i
        found, unmatched = (matched[k], left[k]) if k in matched else saved_of(r, results)
        tangents = [e for e in bw.inputs if e.key in bw.tangent_keys]
        # the bytes of the previous backward's results this one takes over (as the timeline does)
        handed = 0 if last else min(sum(e.nbytes for e in tangents),
                                    sum(live[g].nbytes for g in returned) - returned_params)
        taken = 0
        for e in tangents:
            g = _take(returned, live, e.nbytes, e.device) if not last else None
            if g is not None:
                grads.remove(g)
                taken += e.nbytes
                mapping[e.key] = g
        # results of no tangent's size were consumed by code that ran between the two regions
        # uncompiled (an eager module): they die as this backward starts, up to ``handed``
        for g in sorted(returned, key=lambda g: -live[g].nbytes):
            if taken + live[g].nbytes <= handed:
                taken += live[g].nbytes
                grads.remove(g)
                _free_all(out, live, (g,))
        if not last:  # this region's outputs, consumed by the next region, die here
            _free_all(out, live, unmatched)
        for e in bw.inputs:
            if e.key not in mapping:
                g = None if e.key in bw.tangent_keys else found.get(e.key)
                mapping[e.key] = g if g is not None else alloc(e)
        first_new = len(out)
        run(bw.events, mapping)
        # its gradients: the storages it allocated and returned (an input it still holds, e.g. a
        # tangent a returned view aliases, is no gradient: it stays to the end of the step)
        made = {e.key for e in out[first_new:] if e.op == "alloc"}
        returned = [g for g in mapping.values() if g in live and g in made]
        returned_params = r.param_gradients
        grads += returned
        # what the eager code made before this forward dies after its backward
        _free_all(out, live, [keys.pop(k) for keys in (glue_keys, saved_keys) if k in keys])
        if r.grad_copy:
            tmp = alloc(AllocEvent("alloc", None, r.grad_copy, _device_of(returned, live)))
            _free_all(out, live, (tmp,))
    span = zero_grad = None
    if optimizer is not None:
        start = len(out)
        run(optimizer, {})
        span = (start, len(out))
        _free_all(out, live, grads)
        zero_grad = (span[1], len(out))
    _free_all(out, live, list(live))
    return StepAllocations(baseline=(), events=tuple(out), optimizer_span=span, backward_start=backward_start,
                           zero_grad_span=zero_grad)


def lightning_order(step: StepAllocations) -> StepAllocations:
    """``step`` as Lightning's automatic optimization runs it: ``zero_grad`` (``set_to_none``) comes
    after ``training_step`` and before ``backward``, so the previous step's gradients are live
    through the forward and freed just before the backward; the new ones stay live after the
    optimizer step. The running sum then counts bytes above a start that holds the gradients.

    Returns ``step`` unchanged when it has no ``zero_grad`` (no optimizer).
    """
    if step.zero_grad_span is None or step.backward_start is None:
        return step
    b, (z0, z1) = step.backward_start, step.zero_grad_span
    ev = step.events
    events = (*ev[:b], *ev[z0:z1], *ev[b:z0], *ev[z1:])
    span = step.optimizer_span
    shift = z1 - z0
    return dataclasses.replace(
        step, events=events, backward_start=b + shift, zero_grad_span=(b, b + shift),
        optimizer_span=(span[0] + shift, span[1] + shift) if span is not None else None)


def accumulation_order(step: StepAllocations) -> StepAllocations:
    """``step`` as the last micro-batch of Lightning's gradient accumulation
    (``accumulate_grad_batches`` > 1) runs it, the one of the N that peaks highest: no ``zero_grad``,
    so the accumulated gradients (added to the baseline, one block per gradient) are live all along;
    the backward creates new gradients on top of them, which are added in place and freed right after
    it (``AccumulateGrad``), and the optimizer then steps. The earlier micro-batches peak no higher:
    the same forward and backward, and no optimizer step.

    Returns ``step`` unchanged when it has no optimizer or no ``zero_grad``.
    """
    if step.zero_grad_span is None or step.optimizer_span is None:
        return step
    (z0, z1), (o0, o1) = step.zero_grad_span, step.optimizer_span
    ev = step.events
    accumulated = tuple((e.nbytes, e.device) for e in ev[z0:z1])
    events = (*ev[:o0], *ev[z0:z1], *ev[o0:z0], *ev[z1:])
    shift = z1 - z0
    return dataclasses.replace(step, baseline=(*step.baseline, *accumulated), events=events,
                               optimizer_span=(o0 + shift, o1 + shift), zero_grad_span=(o0, o0 + shift))


def _device_of(keys: Sequence[int], live: dict[int, AllocEvent]) -> str:
    return next((live[g].device for g in keys if g in live), "cuda")


def simulate_cuda_allocator(
    step: StepAllocations, *, device: str = "cuda", max_warmup_steps: int = 4
) -> AllocatorForecast:
    """Replay ``step`` on ``device`` through the CUDA caching allocator model, in the order a run
    of :func:`lightning_memplan.forecast` allocates, from an empty cache.

    1. The baseline (parameters, buffers, inputs, existing optimizer state), in order.
    2. The compiling run: forward and backward once, no optimizer step.
    3. Steps: the first creates ``new_state`` where its optimizer step starts; steps repeat until
       the allocator's statistics of a step equal those of the step before (at most
       ``max_warmup_steps`` steps), then one more is measured, its peaks reset at its start as
       :func:`lightning_memplan.measure_peak` does.

    Storages on other devices are skipped, and so is a free of a storage not allocated yet (the
    previous step's gradients in the first step of :func:`lightning_order`). Not modelled: allocations outside the step's storages
    (cuBLAS workspaces, kept from the first matmul on; a cuDNN call's workspace), blocks cached by
    other work in the same process, more than one stream.

    Raises:
        ValueError: ``max_warmup_steps`` < 1.
    """
    if max_warmup_steps < 1:
        raise ValueError(f"`simulate_cuda_allocator(max_warmup_steps={max_warmup_steps!r})` must be >= 1.")
    model = CachingAllocatorModel()
    for i, (nbytes, dev) in enumerate(step.baseline):
        if dev == device:
            model.malloc(("baseline", i), nbytes)
    events = [(e.op, e.key, e.nbytes) for e in step.events if e.device == device]
    start, stop = step.optimizer_span or (len(step.events), len(step.events))
    # positions of the optimizer's events among the kept ones
    kept_before = sum(1 for e in step.events[:start] if e.device == device)
    kept_opt = sum(1 for e in step.events[start:stop] if e.device == device)
    compiling = events[:kept_before] + events[kept_before + kept_opt:]
    state = [("alloc", ("state", i), n) for i, (n, dev) in enumerate(step.new_state) if dev == device]
    first = events[:kept_before] + state + events[kept_before:]
    live: set[Hashable] = set()

    def run(evs: list[tuple[str, Hashable, int]]) -> tuple[int, int, int, int]:
        start_alloc, start_req = model.allocated_bytes, model.requested_bytes
        model.reset_peak()
        for op, key, nbytes in evs:
            if op == "alloc":
                model.malloc(key, nbytes)
                live.add(key)
            elif key in live:  # else: not made yet (the previous step's gradients, in the first step)
                model.free(key)
                live.discard(key)
        return (model.peak_allocated_bytes - start_alloc, model.peak_requested_bytes - start_req,
                model.peak_allocated_bytes, model.reserved_bytes)

    run(compiling)
    run(first)
    warmup, prev = 1, None
    while warmup < max_warmup_steps:
        cur = run(events)
        warmup += 1
        if cur == prev:
            break
        prev = cur
    baseline_allocated = model.allocated_bytes
    allocated, requested, allocated_max, reserved = run(events)
    return AllocatorForecast(
        allocated_peak_bytes=allocated, requested_peak_bytes=requested, allocated_max_bytes=allocated_max,
        reserved_peak_bytes=reserved, baseline_allocated_bytes=baseline_allocated,
        warmup_steps=warmup, device=device,
    )
