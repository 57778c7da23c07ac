"""Lay one training step out as a timeline: the regions' forwards in the order the step runs them,
their backwards in reverse, then the optimizer; calls of the model repeated within the step, eager
losses between the forward and the backward, FSDP's buffers and inputs made in the step laid in.

Units: bytes live above the baseline (what was live before the step). :class:`PeakTracker` keeps
the highest total seen and its split by category; every layout reports its peak through one.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightning_memplan.core.fsdp_memory import Event as FsdpEvent
from lightning_memplan.core.fsdp_memory import Point
from lightning_memplan.forecasting.allocations import held_past
from lightning_memplan.forecasting.eager_loss import EagerLoss, eager_loss_events
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.forecasting.regions import RegionPlan

__all__ = ["AtPeak", "PeakTracker", "StepParts", "TimelineStep", "lay_out", "lay_out_calls", "run_order"]

AtPeak = tuple[int, int, int, int]
"""Bytes live at the peak by category: (activations, gradients, optimizer temporaries, FSDP buffers)."""


@dataclass(frozen=True, kw_only=True)
class TimelineStep:
    """One step of the predicted schedule: bytes live above the baseline right after ``node`` ran."""

    #: ``"forward"``, ``"backward"`` or ``"optimizer"``.
    phase: str
    #: Region index (``-1`` for the optimizer).
    region: int
    #: Node (FX node name; ``"step"`` for the optimizer).
    node: str
    bytes: int


class PeakTracker:
    """The highest total of bytes seen, and its split by category at that moment.

    :meth:`see` offers a total; only a total strictly higher than the peak so far replaces it (ties
    keep the first, so a later release never changes the split). Before any total above 0 the peak
    is 0 and the split all zeros. Invariant: ``sum(at_peak) == peak``.
    """

    def __init__(self) -> None:
        self._peak = 0
        self._at: AtPeak = (0, 0, 0, 0)

    def see(self, total: int, *, gradients: int, fsdp: int, temporaries: int = 0) -> None:
        """Offer ``total`` bytes live, of which ``gradients`` are gradients, ``fsdp`` FSDP's buffers
        and ``temporaries`` the optimizer step's temporaries; the rest are activations."""
        if total > self._peak:
            self._peak = total
            self._at = (total - gradients - temporaries - fsdp, gradients, temporaries, fsdp)

    @property
    def peak(self) -> int:
        """The highest total seen (0 if none was above 0)."""
        return self._peak

    @property
    def at_peak(self) -> AtPeak:
        """(activations, gradients, optimizer temporaries, FSDP buffers) at :attr:`peak`."""
        return self._at


@dataclass(frozen=True, kw_only=True)
class StepParts:
    """What a forecast's timeline is laid out from, kept so it can be laid out again without compiling."""

    #: One plan per region that could be forecast, in compile order.
    plans: tuple[RegionPlan, ...]
    #: Region indices the compiling run called, in order (see :func:`run_order`).
    executions: tuple[int, ...] = ()
    #: The optimizer's predicted memory; ``None`` without an optimizer.
    optimizer: OptimizerMemory | None = None
    #: FSDP2's buffers as layout events (``overlay`` of :func:`lay_out`); empty without FSDP.
    overlay: Mapping[Point, Sequence[FsdpEvent]] = field(default_factory=dict)
    #: Outputs a later backward held last, by position in :func:`run_order`'s run (``early`` of :func:`lay_out`).
    early: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    #: Outputs the eager code between calls dropped in the forward, by position in
    #: :func:`run_order`'s run (``forward_freed`` of :func:`lay_out`).
    forward_freed: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    #: Bytes the eager code made before each position's forward, held by autograd (its inputs
    #: computed eagerly, what the eager ops saved), by position in :func:`run_order`'s run (laid
    #: out as ``inputs`` of :func:`lay_out`); empty: none.
    glue: tuple[int, ...] = ()
    #: Of ``glue``, the bytes the eager ops saved for their backward (``inputs_saved`` of
    #: :func:`lay_out`); empty: none.
    glue_saved: tuple[int, ...] = ()


def run_order(plans: Sequence[RegionPlan], executions: Sequence[int]) -> list[RegionPlan]:
    """``plans`` in the order the step ran them, once per call (``executions``: region indices;
    regions without a plan are skipped); ``plans`` as they are when nothing was recorded."""
    by_index = {p.index: p for p in plans}
    run = [by_index[i] for i in executions if i in by_index]
    return run if run else list(plans)


def lay_out(
    plans: list[RegionPlan], opt: OptimizerMemory | None, *, ends: frozenset[int] | None = None,
    accumulate: Sequence[int] = (), inputs: Sequence[int] = (), inputs_saved: Sequence[int] = (),
    overlay: Mapping[Point, Sequence[FsdpEvent]] | None = None,
    bw_hold: Mapping[int, int] | None = None,
    bw_views: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    early: Mapping[int, Mapping[int, int]] | None = None,
    eager_freed: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    forward_freed: Mapping[int, Mapping[int, int]] | None = None,
) -> tuple[list[TimelineStep], int, AtPeak]:
    """Lay the regions out as one step: forwards in order, backwards in reverse, then the optimizer.

    ``plans`` are in the order the step runs them, once per call. Regions form a chain: region
    ``r``'s user outputs feed region ``r + 1`` and live until region ``r``'s backward starts, unless
    region ``r + 1``'s backward keeps none of its activation inputs (``keeps_inputs``): then nothing
    holds them once ``r + 1``'s forward has run (the Python frame between two graph breaks inside a
    block ends), and they die there, unless ``forward_freed`` has them die after a later forward
    (eager code holds them longer). The gradients region ``r + 1``'s backward returned are region
    ``r``'s tangents (handed over, up to the activations' gradients it returned: more or fewer when
    uncompiled code ran between the two regions; a non-contiguous one is copied by AOTAutograd, so
    counted again). The last region's outputs (the loss) stay. After each backward, a
    non-contiguous gradient is copied once (``grad_copy``, transient).

    ``ends``: the positions that end one call of the model (their outputs, the loss, stay, and their
    incoming gradient is fresh); default: the last. ``accumulate[j]``: bytes of position ``j``'s
    gradients that autograd sums into the ones already waiting for the same parameters (an earlier
    call of the same model; default 0): out of place in its input buffers, one parameter at a time
    (``sum = old + new``, the old one freed), so the largest sum is transient on top of the
    backward's end; then the new ones are freed.
    ``inputs[j]``: bytes of fresh inputs made just before position ``j``'s forward (another view of
    the batch for a later call; what eager code between regions made, :attr:`StepParts.glue`),
    live until its backward has run (default 0); when that region's backward keeps none of them
    (``keeps_glue``: it saved a cast or a product of them, as under autocast), only
    ``training_step`` refers to them, and they die when it returns, before the backward; but for
    ``inputs_saved[j]`` of them (default 0), what the eager ops that made them saved for their
    own backward (dropout's mask): those live until position ``j``'s backward has run.

    ``overlay``: allocations and frees of others at points of the step (FSDP's buffers,
    :func:`~lightning_memplan.core.fsdp_memory.fsdp_step_events`; the eager loss,
    :func:`~lightning_memplan.forecasting.eager_loss.eager_loss_events`): ``("fw" | "bw", j, "before" |
    "after")`` position ``j``'s forward or backward; each event is a step of its own, counted as
    FSDP buffers or, category ``"gradients"``, as gradients (``zero_grad`` frees them), or,
    category ``"activations"``, as activations.
    ``bw_hold[j]``: bytes live from the start of position ``j``'s backward until its last read of
    its incoming gradient (``tangent_last_use``; unknown: the whole backward), then freed: an
    eager loss's gradients of the outputs, handed to that backward instead of its own tangents.
    ``bw_views[j]``: ``(bytes, step)`` live from the start of position ``j``'s backward through
    ``step`` of its timeline: incoming gradients of single outputs (those an eager loss hands over,
    the zeros autograd makes), each until its own last read (:func:`incoming_gradient_lifetimes`).
    ``early[j]``: ``{i: bytes}`` of position ``i``'s outputs that position ``j``'s backward held
    last (an activation input it saved; watched on a run of the compiled step): they die after its last
    read of its activation inputs (``input_last_use``; unknown: its end) instead of when position
    ``i``'s backward starts.
    ``eager_freed[j]``: ``(i, bytes)`` of position ``i``'s outputs that the eager code after
    position ``j``'s forward (the end of a call) received straight from that region and dropped
    (:attr:`~lightning_memplan.forecasting.eager_loss.EagerLoss.early_outputs`): live through that
    eager code (again, where the next forward had dropped them), freed after it.
    ``forward_freed[j]``: ``{i: bytes}`` of position ``i``'s outputs (``i <= j``) that the eager code
    between position ``j``'s forward and the next one dropped (watched on a run of the compiled
    step): they die after position ``j``'s forward instead of when position ``i``'s backward starts.

    Returns the timeline, the peak, and (activations, gradients, optimizer temporaries, FSDP
    buffers) at the peak.
    """
    ends = frozenset({len(plans) - 1}) if ends is None else ends
    acc = list(accumulate) + [0] * (len(plans) - len(accumulate))
    fresh = list(inputs) + [0] * (len(plans) - len(inputs))
    kept = list(inputs_saved) + [0] * (len(plans) - len(inputs_saved))
    timeline: list[TimelineStep] = []
    best = PeakTracker()
    offset = 0
    grads = 0
    fsdp = 0  # FSDP's buffers live
    freed_early = [0] * len(plans)  # bytes of a position's outputs a later backward freed

    def apply(point: Point, phase: str, region: int) -> None:
        nonlocal offset, grads, fsdp
        for name, category, delta in (overlay or {}).get(point, ()):
            offset += delta
            if category == "gradients":
                grads += delta
            elif category != "activations":
                fsdp += delta
            timeline.append(TimelineStep(phase=phase, region=region, node=name, bytes=offset))
            best.see(offset, gradients=grads, fsdp=fsdp)
    dropped = [False] * len(plans)  # outputs freed after the next forward
    for j, p in enumerate(plans):
        offset += fresh[j]
        apply(("fw", j, "before"), "forward", p.index)
        for node, b in zip(p.fw_nodes, p.fw_timeline):
            timeline.append(TimelineStep(phase="forward", region=p.index, node=node, bytes=offset + b))
        best.see(offset + max(p.fw_timeline), gradients=grads, fsdp=fsdp)
        offset += p.fw_retained
        if (j > 0 and not p.keeps_inputs and plans[j - 1].bw_timeline and j - 1 not in ends
                and j - 1 not in held_past(forward_freed, j)):
            dropped[j - 1] = True
            offset -= max(0, plans[j - 1].fw_retained - plans[j - 1].saved - freed_early[j - 1])
        cuts = {i: min(n, max(0, plans[i].fw_retained - plans[i].saved - freed_early[i]))
                for i, n in (forward_freed or {}).get(j, {}).items() if i <= j and not dropped[i] and i not in ends}
        for i, n in cuts.items():
            offset -= n
            freed_early[i] += n
        if any(cuts.values()):
            timeline.append(TimelineStep(phase="forward", region=p.index, node="outputs_freed", bytes=offset))
        freed = []  # (position, bytes) the eager code after this forward frees
        for i, n in (eager_freed or {}).get(j, ()):
            if dropped[i]:
                offset += n  # live at the call's return
                freed.append((i, n))
            else:
                freed.append((i, min(n, max(0, plans[i].fw_retained - plans[i].saved - freed_early[i]))))
        apply(("fw", j, "after"), "forward", p.index)
        for i, n in freed:
            offset -= n
            if not dropped[i]:
                freed_early[i] += n
        if freed:
            timeline.append(TimelineStep(phase="forward", region=p.index, node="eager_outputs_freed", bytes=offset))
    for j, p in enumerate(plans):
        if fresh[j] and not p.keeps_glue:  # freed when training_step returns, but what eager ops saved
            gone = max(0, fresh[j] - kept[j])
            offset -= gone
            fresh[j] -= gone
    produced = 0  # gradients of activations the previous backward returned
    for i, p in enumerate(reversed(plans)):
        pos = len(plans) - 1 - i
        apply(("bw", pos, "before"), "backward", p.index)
        if not p.bw_timeline:
            apply(("bw", pos, "after"), "backward", p.index)
            continue
        last = pos in ends
        handed = 0 if last else min(p.tangents, produced)  # gradients of this region's outputs, live
        grads -= handed
        gone = last or dropped[pos]
        start = offset - p.saved - (0 if gone else max(0, p.fw_retained - p.saved - freed_early[pos]))
        if p.tangents_in_timeline:
            start -= handed
        held = (bw_hold or {}).get(pos, 0)
        upto = len(p.bw_timeline) - 1 if p.tangent_last_use is None else p.tangent_last_use
        # earlier positions' outputs this backward held last (not those already dropped)
        cuts = {i: min(n, max(0, plans[i].fw_retained - plans[i].saved - freed_early[i]))
                for i, n in (early or {}).get(pos, {}).items() if i < pos and not dropped[i] and i not in ends}
        cut = sum(cuts.values())
        at = len(p.bw_timeline) - 1 if p.input_last_use is None else p.input_last_use
        views = (bw_views or {}).get(pos, ())
        steps = [b + (held if k <= upto else 0) + sum(n for n, until in views if k <= until)
                 - (cut if k > at else 0) for k, b in enumerate(p.bw_timeline)]
        for node, b in zip(p.bw_nodes, steps):
            timeline.append(TimelineStep(phase="backward", region=p.index, node=node, bytes=start + b))
        if not cut:
            best.see(start + p.bw_peak, gradients=grads + p.bw_grads_at_peak, fsdp=fsdp)
            if held or views:
                best.see(start + max(steps), gradients=grads, fsdp=fsdp)
        else:
            best.see(start + max(steps), gradients=grads + min(p.bw_grads_at_peak, max(steps)), fsdp=fsdp)
        for i, n in cuts.items():
            freed_early[i] += n
        offset = start + p.bw_end - (0 if p.tangents_in_timeline else handed) - cut
        if acc[pos]:
            top = offset + p.largest_param_gradient  # one accumulated sum beside the new gradients
            timeline.append(TimelineStep(phase="backward", region=p.index, node="accumulate_grad", bytes=top))
            best.see(top, gradients=grads + p.gradients + p.largest_param_gradient, fsdp=fsdp)
            offset -= acc[pos]
        offset -= fresh[pos]
        grads += p.gradients - acc[pos]
        produced = p.gradients - p.param_gradients
        if p.grad_copy:
            timeline.append(TimelineStep(phase="backward", region=p.index, node="accumulate_grad",
                                         bytes=offset + p.grad_copy))
            best.see(offset + p.grad_copy, gradients=grads + p.grad_copy, fsdp=fsdp)
        apply(("bw", pos, "after"), "backward", p.index)
    if opt is not None:
        top = offset + opt.step_peak_bytes
        timeline.append(TimelineStep(phase="optimizer", region=-1, node="step", bytes=top))
        best.see(top, gradients=grads, fsdp=fsdp, temporaries=opt.step_peak_bytes)
        timeline.append(TimelineStep(phase="optimizer", region=-1, node="zero_grad", bytes=offset - grads))
    return timeline, best.peak, best.at_peak


def incoming_gradient_lifetimes(views: Sequence[tuple[int, Sequence[int]]],
                                loss: EagerLoss, *, earliest: bool = False) -> tuple[list[tuple[int, int]], int]:
    """How long the incoming gradients of a region's backward live, from ``loss`` (the eager code
    on its outputs): the outputs' gradients its backward ends with (``output_grad_sizes``) and the
    zero gradients autograd makes for the outputs it does not reach (``zero_grad_sizes``).

    Each that has a view of its size among ``views`` (a region plan's ``tangent_views``: the stand-in
    loss's gradient expanded to an output's shape, with the steps reading it) dies after a reader of
    that view: the gradients of one size take that size's readers from the last one back (each
    reader stands for one output; with fewer outputs than readers, the latest), or with
    ``earliest`` from the first one on (the kernels of generated code: the first to read a
    gradient adds it into the buffer the later ones read). Returns
    ``([(bytes, step), ...], rest)``: ``rest``, the bytes with no view (or sizes not known apart),
    lives to the backward's last read of its incoming gradient."""
    readers: dict[int, list[int]] = {}
    for nbytes, steps in views:
        readers.setdefault(nbytes, []).extend(steps)
    for steps in readers.values():
        steps.sort()
    out: list[tuple[int, int]] = []
    rest = 0
    for sizes, total in ((loss.output_grad_sizes, loss.output_grad_bytes),
                         (loss.zero_grad_sizes, loss.zero_grad_bytes)):
        if sum(sizes) != total:
            rest += total
            continue
        for size in sizes:
            steps = readers.get(size)
            if steps:
                out.append((size, steps.pop(0) if earliest else steps.pop()))
            else:
                rest += size
    return out, rest


def lay_out_calls(calls: Sequence[StepParts], *, extra: Sequence[int] = (), losses: Sequence[EagerLoss] = (),
                  made: int = 0) -> tuple[list[TimelineStep], int, AtPeak]:
    """Lay out a step that calls the model ``len(calls)`` times and backpropagates through all of
    them: ``calls[c]`` is what call ``c`` runs (the same parts again for a repeated call); the
    optimizer and, for one call, FSDP's overlay are the first call's.

    Forwards in call order, each call's saved activations live until its own backward, backwards
    from the last call to the first (autograd's order); every call's parameter gradients but the
    last's are summed into the last's (``accumulate`` of :func:`lay_out`). ``extra[c - 1]``: bytes of
    the fresh inputs of call ``c >= 1``; ``made``: bytes of the first call's inputs made in the step;
    ``losses``: none, or the eager loss of each call, laid in around the end of its call
    (:func:`~lightning_memplan.forecasting.eager_loss.eager_loss_events`). A call whose eager code
    holds one of the outputs (``held_inner_bytes``) keeps them through its backward.

    Returns what :func:`lay_out` returns.
    """
    n = len(calls)
    first = calls[0]
    ones = [run_order(c.plans, c.executions) for c in calls]
    earlies = [c.early for c in calls]
    starts = [0]
    for run in ones:
        starts.append(starts[-1] + len(run))
    seq = [p for run in ones for p in run]
    ends = [starts[c + 1] - 1 for c in range(n)]
    acc = [p.param_gradients if j < starts[n - 1] else 0 for j, p in enumerate(seq)]
    fresh = [0] * len(seq)
    kept = [0] * len(seq)
    for c in range(1, n):
        fresh[starts[c]] = extra[c - 1]
    fresh[0] += made
    for c, parts in enumerate(calls):  # what each call's eager code made before its regions
        for j, nbytes in enumerate(parts.glue[:len(ones[c])]):
            fresh[starts[c] + j] += nbytes
        for j, nbytes in enumerate(parts.glue_saved[:len(ones[c])]):
            kept[starts[c] + j] += nbytes
    events: dict[Point, list[FsdpEvent]] = {k: list(v) for k, v in first.overlay.items()} if n == 1 else {}
    hold: dict[int, int] = {}
    views: dict[int, list[tuple[int, int]]] = {}
    # outputs an earlier region handed the eager code name that region by its place in the call:
    # a call laid out in another number of regions counts them as outputs of the call instead,
    # but for one that ends in a stand-in loss of its own (see _stand_in_of_its_own)
    losses = [loss if loss.regions == len(run) else
              loss.with_outputs_held_by(len(run) - 2) if _stand_in_of_its_own(loss, run) else
              loss.with_early_outputs_counted()
              for loss, run in zip(losses, ones)]
    for end, loss in zip(ends, losses):
        for point, evs in eager_loss_events(loss, end).items():
            events.setdefault(point, []).extend(evs)
        # Under inductor the stand-in loss's gradient, broadcast to the outputs' shape, is
        # realized as a buffer of their size wherever a matmul reads it, until its last read:
        # it already stands in for the real gradients there. Not for the zeros autograd makes
        # for the outputs the loss does not reach: inputs of the real backward, each live beside
        # that buffer until the first kernel reading its view adds it in. In an FX graph the
        # stand-in stays a view of the scalar.
        if seq[end].method != "fx":
            zeros = dataclasses.replace(loss, output_grad_bytes=0, output_grad_sizes=())
            known, _ = incoming_gradient_lifetimes(seq[end].tangent_views, zeros, earliest=True)
            views[end], hold[end] = known, 0  # zeros no kernel is known to read: not counted
            continue
        views[end], hold[end] = incoming_gradient_lifetimes(seq[end].tangent_views, loss)
    # each call's outputs die where the compiling run's did, in that call's own backwards, unless
    # training_step took hold of one of them (returned it: Lightning keeps it through the backward)
    held = [c < len(losses) and losses[c].held_inner_bytes > 0 for c in range(n)]
    freed = {ends[c]: [(starts[c] + r, b) for r, b in loss.early_outputs]
             for c, loss in enumerate(losses) if loss.early_outputs}
    run_early = {starts[c] + j: {starts[c] + i: b for i, b in by.items()}
                 for c in range(n) if not held[c] for j, by in (earlies[c] or {}).items()}
    # outputs the eager code between two region calls of one call of the model dropped
    forward = {starts[c] + j: {starts[c] + i: b for i, b in by.items()}
               for c, parts in enumerate(calls) for j, by in parts.forward_freed.items()}
    return lay_out(seq, first.optimizer, ends=frozenset(ends), accumulate=acc, inputs=fresh, inputs_saved=kept,
                   overlay=events, bw_hold=hold, bw_views=views, early=run_early, eager_freed=freed,
                   forward_freed=forward)


def _stand_in_of_its_own(loss: EagerLoss, run: Sequence[RegionPlan]) -> bool:
    """Whether ``run`` (one call of the forecast) is the measured call's regions and, last, the
    forecast's stand-in loss compiled on its own (a graph break before it: the model's last module
    compiled on its own): one region more than ``loss`` saw, which saves nothing and reads no
    trainable parameter."""
    return bool(loss.regions) and loss.regions + 1 == len(run) and run[-1].saved == 0 and run[-1].param_gradients == 0
