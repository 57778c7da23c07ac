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
    assert len(few.trials) == 3 and few.batch_size == 4 and "ran out" in few.reason
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
