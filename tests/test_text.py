"""The plain-text helpers: lists cut short, lines broken to a terminal's width."""
from __future__ import annotations

import pytest

from lightning_memplan.text import COLUMNS, fill, listed

pytestmark = pytest.mark.unit


def test_listed_names_the_first_and_counts_the_rest() -> None:
    assert listed(["a", "b", "c"], 2) == "a, b and 1 more"
    assert listed(["a"], 2) == "a"


def test_fill_breaks_long_lines_at_spaces_and_keeps_short_ones() -> None:
    words = " ".join(f"word{i}" for i in range(60))
    text = fill(f"short line\n  {words}\nend")
    lines = text.splitlines()
    assert lines[0] == "short line" and lines[-1] == "end"
    assert all(len(line) <= COLUMNS for line in lines)
    assert lines[1].startswith("  word0 ") and all(line.startswith("    word") for line in lines[2:-1])
    assert " ".join(text.split()) == f"short line {words} end"  # nothing lost


def test_fill_keeps_a_number_with_its_unit_and_a_path_whole() -> None:
    text = fill("x" * 95 + " 10.96 MiB then more", width=100)
    assert text.splitlines()[1].strip().startswith("10.96 MiB")
    path = "/a/" + "b" * 120 + ".png"
    assert fill(f"wrote {path}") == f"wrote\n  {path}"  # a word wider than the line stays whole
