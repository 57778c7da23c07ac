from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_memplan.plan import Candidate, MemPlan


def _plan() -> MemPlan:
    cands = (
        Candidate(budget=1.0, peak_bytes=400, cost=0.0),
        Candidate(budget=0.5, checkpoint=("blocks.1",), peak_bytes=250, cost=3e9, note="solver called"),
    )
    return MemPlan(budget=0.5, solver="dp", checkpoint=("blocks.1",), backend="aot_eager",
                   predicted_peak_bytes=250, baseline_bytes=1000,
                   breakdown={"activations": 200, "gradients": 50}, reason="knee",
                   knee=1, chosen=1, candidates=cands, notes=("region 0: solver called",),
                   regional=("blocks.0", "blocks.1"))


def test_json_round_trip(tmp_path: Path) -> None:
    plan = _plan()
    path = plan.save(tmp_path / "sub" / "plan.json")
    assert json.loads(path.read_text())["format"] == 1
    assert MemPlan.load(path) == plan and MemPlan.load(path).regional == ("blocks.0", "blocks.1")
    assert plan.candidates[1].label == "budget 0.5, 1 ckpt"


def test_old_and_extra_keys(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"budget": 0.3, "solver": "ilp", "future_key": 1}))
    plan = MemPlan.load(p)
    assert plan.budget == 0.3 and plan.solver == "ilp" and plan.candidates == () and plan.regional == ()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", r"plan file '.*p.json' is not valid JSON"),
        ('{"solver": "dp"}', r"plan file '.*p.json' is not a MemPlan: expected a JSON object with 'budget'"),
        ('{"budget": 1.5, "solver": "dp"}', r"is not a valid MemPlan: `MemPlan\(budget=1.5\)` must be a number in \[0, 1\]"),
        ('{"budget": 0.5, "solver": "dp", "format": 9}', r"has plan format 9; this version reads format 1"),
        ('{"budget": 0.5, "solver": "dp", "knee": 3}', r"`MemPlan\(knee=3\)` must index `candidates`"),
    ],
)
def test_bad_plan_files(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / "p.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=match):
        MemPlan.load(p)
