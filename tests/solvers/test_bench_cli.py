"""`memplan bench` runs end to end on a tiny configuration and prints the three tables."""
from __future__ import annotations

import pytest

from lightning_memplan.cli import main


def test_bench_prints_side_by_side_tables(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--sizes", "30", "--seeds", "1", "--repeats", "1", "--frontier-n", "25",
                 "--torch-timeout", "30"])
    out = capsys.readouterr().out
    assert code == 0
    for solver in ("greedy", "dp", "hirschberg", "ilp"):
        assert f"|  30 | {solver}" in out
    assert "frontier n=25" in out and "dp n=30" in out
    assert "torch knee budget" in out
    # our exact solvers: no violation, no crash, never suboptimal
    for line in out.splitlines():
        if line.startswith("|  30 |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[9] == "0/0"
            assert cells[11] in ("-", "0/1")


def test_bench_rejects_bad_counts() -> None:
    with pytest.raises(SystemExit, match=r"--seeds, --repeats and --sizes must be >= 1, got seeds=0"):
        main(["bench", "--seeds", "0"])
