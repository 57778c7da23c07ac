"""The largest batch that fits a memory limit, from forecasts: plain data, no torch.

A *trial* forecasts the step at one batch size and says whether some plan fits the limit
(:class:`BatchTrial`). :func:`largest_fitting` asks for trials as Lightning's ``BatchSizeFinder``
runs real steps in its ``"binsearch"`` mode, but judges each by its forecast, so nothing runs out
of memory, and it reads the forecast's bytes, not only its verdict: a step's memory is close to
affine in its batch (activations grow with it, parameters and optimizer state do not), so the
next size tried is where the line through two trials meets the limit. On an affine step that is
the answer, and the size above it confirms it: four trials from the start (the start, twice it,
the line's size, one more). Where the line misses (rounding to allocator blocks, a plan that
changes with the batch), the search still brackets: it doubles from ``start`` while the trial fits
(halves while it does not) and then narrows the bracket between the largest size that fits and the
smallest that does not, by the line or by bisection, bisecting whenever two steps did not halve it,
so it takes a logarithmic number of trials whatever the memory curve. It relies on one invariant: a
step's memory does not shrink as its batch grows, so once a size does not fit, no larger one does.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lightning_memplan.units import format_bytes

__all__ = ["BatchSizeChoice", "BatchTrial", "largest_fitting"]

#: The most a size grows over the last that fit, in one trial (the line can point far off when
#: the memory barely grows with the batch).
_MAX_GROWTH = 64


@dataclass(frozen=True, kw_only=True)
class BatchTrial:
    """The forecast of one training step at one batch size."""

    #: Samples per batch.
    batch_size: int
    #: Whether a plan's forecast fits the limit.
    fits: bool
    #: The plan in words: the fastest that fits, else the one with the smallest forecast.
    plan: str = ""
    #: That plan's forecast total held against the limit (bytes: baseline + peak, and on CUDA the
    #: caching allocator's reserve); ``None`` when no forecast was made.
    total_bytes: int | None = None
    #: That plan's estimated compute over the fastest plan's at this batch (a ratio; 0.0: none extra).
    extra_compute: float | None = None
    #: The smallest forecast total of the plans tried at this size (bytes, as ``total_bytes``): the
    #: size fits when it is within the limit; what the search draws its line through. ``None``: not known.
    least_bytes: int | None = None
    #: Why there is no forecast, or what else to know of this trial.
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class BatchSizeChoice:
    """The largest batch whose step fits, and every trial that found it."""

    #: The largest batch size that fits; ``None`` when not even the smallest tried does.
    batch_size: int | None
    #: Every trial, in the order they were made.
    trials: tuple[BatchTrial, ...]
    #: The limit the trials were judged against (bytes).
    limit_bytes: int
    #: Where the limit came from, in words.
    limit_source: str
    #: How the search ended, in words.
    reason: str = ""
    #: Wall time of the search, trials included (seconds); ``None`` when not timed.
    seconds: float | None = None

    @property
    def chosen(self) -> BatchTrial | None:
        """The trial at :attr:`batch_size` (``None`` when none fits)."""
        return next((t for t in self.trials if t.batch_size == self.batch_size and t.fits), None)

    def table(self) -> str:
        """The trials as a table of at most 100 columns: batch, plan, forecast total, extra compute, fits?"""
        head = f"{'batch':>7}  {'plan':<38} {'forecast':>11} {'extra compute':>13}  fits?"
        lines = [head, "-" * len(head)]
        for t in sorted(self.trials, key=lambda t: t.batch_size):
            total = format_bytes(t.total_bytes) if t.total_bytes is not None else "-"
            extra = f"{100 * t.extra_compute:+.0f}%" if t.extra_compute is not None else "-"
            plan = (t.plan or t.note)[:38]
            lines.append(f"{t.batch_size:>7}  {plan:<38} {total:>11} {extra:>13}  {'yes' if t.fits else 'no'}")
        took = f" ({len(self.trials)} trials in {self.seconds:.1f} s)" if self.seconds is not None else ""
        lines.append(f"limit {format_bytes(self.limit_bytes)} ({self.limit_source}); {self.reason}{took}")
        return "\n".join(lines)


def largest_fitting(trial: Callable[[int], BatchTrial], *, start: int, limit_bytes: int, limit_source: str,
                    max_size: int | None = None, max_trials: int = 16) -> BatchSizeChoice:
    """The largest batch size ``b`` (``1 <= b <= max_size``) for which ``trial(b).fits``, found with at
    most ``max_trials`` trials (see the module docstring). ``trial`` is called once per size.

    Raises:
        ValueError: ``start`` or ``max_trials`` is not an int >= 1, or ``max_size`` < 1.
    """
    for name, value in (("start", start), ("max_trials", max_trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`largest_fitting({name}={value!r})` must be an int >= 1.")
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
        raise ValueError(f"`largest_fitting(max_size={max_size!r})` must be an int >= 1 or None.")
    t0 = time.perf_counter()
    top = max_size
    start = min(start, top) if top is not None else start
    seen: dict[int, BatchTrial] = {}

    def fits(b: int) -> bool:
        if b not in seen:
            seen[b] = trial(b)
        return seen[b].fits

    def done(size: int | None, reason: str) -> BatchSizeChoice:
        return BatchSizeChoice(batch_size=size, trials=tuple(seen.values()), limit_bytes=limit_bytes,
                               limit_source=limit_source, reason=reason, seconds=time.perf_counter() - t0)

    def on_line(a: int, b: int) -> int | None:
        """The largest size the line through trials ``a`` and ``b`` holds within the limit (``None``:
        a trial has no bytes, or the line does not rise)."""
        ma, mb = seen[a].least_bytes, seen[b].least_bytes
        if ma is None or mb is None or mb <= ma:
            return None
        return a + (limit_bytes - ma) * (b - a) // (mb - ma)

    def left() -> bool:
        return len(seen) < max_trials

    # bracket: good fits, bad does not (None: not found yet)
    good: int | None
    bad: int | None
    if fits(start):
        good, bad, last = start, None, None
        while bad is None and left():
            if top is not None and good >= top:
                return done(good, f"{good} fits, the most there is to batch ({top})")
            guess = on_line(last, good) if last is not None else None
            nxt = 2 * good if guess is None else min(max(guess, good + 1), _MAX_GROWTH * good)
            nxt = nxt if top is None else min(nxt, top)
            last = good
            if fits(nxt):
                good = nxt
            else:
                bad = nxt
    else:
        good, bad, last = None, start, None
        while good is None and bad > 1 and left():
            guess = on_line(bad, last) if last is not None else None
            nxt = bad // 2 if guess is None else min(max(guess, 1), bad - 1)
            last = bad
            if fits(nxt):
                good = nxt
            else:
                bad = nxt
        if good is None:
            return done(None, f"not even batch {min(seen)} fits" if bad == 1 else
                        f"no batch down to {min(seen)} fits within {max_trials} trials")
    if bad is None:
        return done(good, f"{good} fits; the trials ran out ({max_trials}) before a size that does not")
    widths = [bad - good]
    while bad - good > 1 and left():
        halved = len(widths) < 3 or widths[-1] <= widths[-3] // 2
        guess = on_line(good, bad) if halved else None
        nxt = (good + bad) // 2 if guess is None else min(max(guess, good + 1), bad - 1)
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
        widths.append(bad - good)
    if bad - good > 1:
        return done(good, f"the largest found: {good} fits, {bad} does not ({max_trials} trials)")
    return done(good, f"the largest that fits: {good} fits, {bad} does not")
