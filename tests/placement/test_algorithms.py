from __future__ import annotations

import pytest

from lightning_memplan.placement import ALGORITHMS, Buffer, get_algorithm, validate


def test_every_algorithm_shares_the_signature() -> None:
    bufs = [Buffer(id=i, lower=i, upper=i + 2, size=4) for i in range(4)]
    assert set(ALGORITHMS) == {"search", "greedy_by_size", "greedy_by_position"}
    for name in ALGORITHMS:
        plan = get_algorithm(name)(bufs, 64, time_limit=5.0)
        assert validate(plan) and plan.algorithm == name


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"algorithm='ilp'.*Expected one of \['greedy_by_position', 'greedy_by_size', 'search'\]"):
        get_algorithm("ilp")
