"""The largest batch that fits, from trials (plain data): the search against a brute-force oracle."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_memplan.core.batch_search import BatchTrial, largest_fitting


def _memory(per_sample: int, fixed: int):  # an affine step: memory grows with the batch
    def trial(b: int) -> BatchTrial:
        total = fixed + per_sample * b
        return BatchTrial(batch_size=b, fits=total <= 10_000, plan="budget 1", total_bytes=total, extra_compute=0.0)
    return trial


def _curve(memory, limit: int = 10_000):  # a trial that reports its bytes, as the planner's do
    def trial(b: int) -> BatchTrial:
        total = int(memory(b))
        return BatchTrial(batch_size=b, fits=total <= limit, plan="budget 1", total_bytes=total, least_bytes=total)
    return trial


@pytest.mark.parametrize("seed", range(30))
def test_an_affine_step_is_found_in_four_trials(seed: int) -> None:
    """The line through two trials meets the limit at the answer; one more size confirms it."""
    rng = np.random.default_rng(seed)
    per, fixed, start = int(rng.integers(1, 300)), int(rng.integers(0, 9000)), int(rng.integers(1, 200))
    best = max((b for b in range(1, 20_000) if fixed + per * b <= 10_000), default=None)
    if best is None or best == 1:
        pytest.skip("no line to draw: at most batch 1 fits")
    choice = largest_fitting(_curve(lambda b: fixed + per * b), start=start, limit_bytes=10_000, limit_source="t")
    assert choice.batch_size == best, choice.trials
    assert len(choice.trials) <= 4, [t.batch_size for t in choice.trials]
    assert choice.reason == f"the largest that fits: {best} fits, {best + 1} does not"


@pytest.mark.parametrize("shape", ["quadratic", "blocks", "steps", "flat"])
@pytest.mark.parametrize("seed", range(10))
def test_a_curve_off_the_line_is_still_found_exactly_in_logarithmic_trials(shape: str, seed: int) -> None:
    """Memory that is not affine in the batch (growing faster, rounded up to allocator blocks, a
    plan that jumps, nearly flat): the line misses, the bracket still closes on the oracle's answer."""
    rng = np.random.default_rng(seed)
    per, fixed, start = int(rng.integers(1, 60)), int(rng.integers(0, 5000)), int(rng.integers(1, 300))
    memory = {
        "quadratic": lambda b: fixed + per * b + b * b // 7,
        "blocks": lambda b: -(-(fixed + per * b) // 512) * 512,
        "steps": lambda b: fixed + per * b + (1500 if b > 40 else 0) + (b // 50) * 700,
        "flat": lambda b: 9_000 + b // 10,
    }[shape]
    best = max((b for b in range(1, 200_000) if memory(b) <= 10_000), default=None)
    calls: list[int] = []
    trial = _curve(memory)
    choice = largest_fitting(lambda b: (calls.append(b), trial(b))[1], start=start, limit_bytes=10_000,
                             limit_source="t", max_trials=64)
    assert choice.batch_size == best, [(t.batch_size, t.least_bytes) for t in choice.trials]
    assert len(calls) == len(set(calls))
    assert len(calls) <= 3 * int(np.log2(max(best or 1, start))) + 8, calls


@pytest.mark.parametrize("seed", range(20))
def test_the_largest_fitting_batch_is_the_oracle_s(seed: int) -> None:
    rng = np.random.default_rng(seed)
    per, fixed, start = int(rng.integers(1, 300)), int(rng.integers(0, 9000)), int(rng.integers(1, 200))
    best = max((b for b in range(1, 20_000) if fixed + per * b <= 10_000), default=None)
    calls: list[int] = []
    trial = _memory(per, fixed)
    choice = largest_fitting(lambda b: (calls.append(b), trial(b))[1], start=start, limit_bytes=10_000,
                             limit_source="test", max_trials=64)
    assert choice.batch_size == best
    assert len(calls) == len(set(calls)) and len(calls) <= 2 * 15 + 2  # each size once; logarithmic
    if best is not None:
        assert choice.chosen is not None and choice.chosen.fits


def test_max_size_caps_the_batch_and_max_trials_caps_the_search() -> None:
    roomy = _memory(1, 0)
    assert largest_fitting(roomy, start=8, limit_bytes=10_000, limit_source="t", max_size=100).batch_size == 100
    few = largest_fitting(roomy, start=1, limit_bytes=10_000, limit_source="t", max_trials=3)
    assert len(few.trials) == 3 and few.batch_size == 4 and "ran out" in few.reason  # no bytes: doubled
    nothing = largest_fitting(_memory(100, 20_000), start=8, limit_bytes=10_000, limit_source="t")
    assert nothing.batch_size is None and nothing.chosen is None and "not even batch 1 fits" in nothing.reason
    table = nothing.table()
    assert max(len(line) for line in table.splitlines()) <= 100 and "limit 9.77 KiB (t)" in table
    assert nothing.seconds is not None and f"({len(nothing.trials)} trials in " in table.splitlines()[-1]


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match=r"`largest_fitting\(start=0\)` must be an int >= 1"):
        largest_fitting(_memory(1, 0), start=0, limit_bytes=1, limit_source="t")
    with pytest.raises(ValueError, match=r"`largest_fitting\(max_size=0\)` must be an int >= 1 or None"):
        largest_fitting(_memory(1, 0), start=1, limit_bytes=1, limit_source="t", max_size=0)
