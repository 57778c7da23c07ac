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


def test_issue_24_bench_help_describes_the_command_and_every_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "Benchmark the knapsack solvers" in text and "torch's four" in text
    options = text[text.index("options:"):]
    expected = {
        "--sizes": "50 200 1000 3000", "--seeds": "3", "--budget": "0.5", "--repeats": "3",
        "--torch-timeout": "60.0", "--frontier-n": "300",
    }
    flags = list(expected)
    for k, flag in enumerate(flags):
        start = options.index(f" {flag} ")
        end = options.index(f" {flags[k + 1]} ") if k + 1 < len(flags) else len(options)
        assert f"(default: {expected[flag]})" in options[start:end], (flag, options[start:end])
