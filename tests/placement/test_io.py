from __future__ import annotations

from pathlib import Path

import pytest

from lightning_memplan.placement import (
    Buffer,
    MemorySpace,
    Plan,
    greedy_by_size,
    read_csv,
    write_csv,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.csv"
    path.write_text(text)
    return path


def test_round_trip_adds_an_offset_column(tmp_path: Path) -> None:
    bufs = read_csv(write(tmp_path, "id,lower,upper,size\n0,0,4,8\n1,2,6,4\nx,5,9,8\n"))
    assert bufs[0] == Buffer(id=0, lower=0, upper=4, size=8)
    assert bufs[2].id == "x"
    plan = greedy_by_size(bufs, 64)
    out = tmp_path / "out.csv"
    write_csv(out, plan)
    lines = out.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size,offset"
    assert lines[1] == f"0,0,4,8,{plan.offset[0]}"
    again = read_csv(out)  # the offset column is accepted and ignored on input
    assert again == bufs


def test_alignment_and_space_columns(tmp_path: Path) -> None:
    bufs = read_csv(write(tmp_path, "size,upper,lower,id,alignment\n3,2,0,a,4\n"))
    assert bufs == (Buffer(id="a", lower=0, upper=2, size=3, alignment=4),)
    spaces = (MemorySpace(name="sram", capacity=2), MemorySpace(name="hbm", capacity=8))
    out = tmp_path / "out.csv"
    write_csv(out, greedy_by_size(bufs, spaces))
    assert out.read_text().splitlines() == ["id,lower,upper,size,alignment,offset,space", "a,0,2,3,4,0,hbm"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"in\.csv: the file is empty\. Expected the header `id,lower,upper,size`"),
        ("id,lower,size\n0,0,4\n", r"in\.csv:1: header 'id,lower,size' is not valid\. Expected the columns"),
        ("id,lower,upper,size,colour\n", r"header 'id,lower,upper,size,colour' is not valid"),
        ("id,lower,upper,size\n0,0,4\n", r"in\.csv:2: row '0,0,4' has 3 fields\. Expected 4"),
        ("id,lower,upper,size\n0,0,4,8\n1,0,four,8\n", r"in\.csv:3: `upper='four'` is not valid\. Expected an integer"),
        ("id,lower,upper,size\n0,0,4,-8\n", r"in\.csv:2: .*size=-8.*integer >= 0"),
        ("id,lower,upper,size\n0,4,4,8\n", r"in\.csv:2: .*lower=4, upper=4.*upper > lower"),
        ("id,lower,upper,size\n0,0,4,8\n0,1,2,3\n", r"in\.csv:3: duplicate `id=0` \(first on line 2\)\. Expected unique ids"),
        ("id,lower,upper,size\n,0,4,8\n", r"in\.csv:2: `id=''` is not valid"),
    ],
)
def test_malformed_csv_names_the_line(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_csv(write(tmp_path, text))


def test_missing_file_and_infeasible_plan(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.csv` cannot be read.*Expected a readable CSV file"):
        read_csv(tmp_path / "nope.csv")
    bufs = (Buffer(id=0, lower=0, upper=1, size=4),)
    plan = Plan(buffers=bufs, spaces=(MemorySpace(name="m", capacity=4),), space=(None,), offset=(None,), algorithm="hand")
    with pytest.raises(ValueError, match=r"leaves 1 buffer\(s\) unplaced\. Expected a feasible plan"):
        write_csv(tmp_path / "out.csv", plan)
