"""Every example runs as written, in its fast mode, in a fresh process; the LightningCLI example is
also the check that MemPlanCallback is configurable from YAML."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(tmp_path: Path, *argv: str, timeout: int = 600) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_basic_use(tmp_path: Path) -> None:
    out = _run(tmp_path, str(EXAMPLES / "basic_use.py"), "--fast")
    assert "plan: budget" in out and "chosen by knee" in out
    assert list(tmp_path.glob("memplan_out/lightning_logs/version_0/memplan/frontier.png"))


def test_byte_target(tmp_path: Path) -> None:
    out = _run(tmp_path, str(EXAMPLES / "byte_target.py"), "--fast", "--max-memory", "64MiB")
    assert "cheapest plan within max_memory 64.00 MiB" in out


def test_tune_then_train(tmp_path: Path) -> None:
    out = _run(tmp_path, str(EXAMPLES / "tune_then_train.py"), "--fast")
    plan = json.loads((tmp_path / "memplan_out" / "plan.json").read_text())
    assert f"trained with budget {plan['budget']:g} from" in out
    # the fast mode's two budgets (no checkpointing), then the search's whole-graph remat plans
    assert [c["solver"] for c in plan["candidates"]] == ["", "", "remat", "remat", "remat"]


def test_lightning_cli_fits_from_yaml(tmp_path: Path) -> None:
    out = _run(tmp_path, str(EXAMPLES / "lightning_cli.py"), "fit", "--config",
               str(EXAMPLES / "lightning_cli.yaml"), "--fast")
    log_dir = tmp_path / "memplan_out" / "lightning_logs" / "version_0"
    # the timeline is drawn once a batch was measured; the config LightningCLI saved is the YAML's
    assert (log_dir / "memplan" / "timeline.png").is_file(), out[-2000:]
    assert "lightning_memplan.MemPlanCallback" in (log_dir / "config.yaml").read_text()


def test_ddp_cpu_two_processes(tmp_path: Path) -> None:
    out = _run(tmp_path, str(EXAMPLES / "ddp_cpu.py"), "--fast")
    lines = [ln for ln in out.splitlines() if ln.startswith("rank ")]
    assert sorted(ln.split(":")[0] for ln in lines) == ["rank 0", "rank 1"], out[-2000:]
    assert len({ln.split(":")[1].split(",")[0] for ln in lines}) == 1  # one budget on both ranks


def test_callback_is_configured_from_the_yaml() -> None:
    """Issue 4, item 6: LightningCLI builds MemPlanCallback with the YAML's init_args."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures]")
    import yaml

    sys.path.insert(0, str(EXAMPLES))
    try:
        from lightning_cli import cli_main
    finally:
        sys.path.remove(str(EXAMPLES))
    from lightning_memplan import MemPlanCallback

    config = EXAMPLES / "lightning_cli.yaml"
    init = yaml.safe_load(config.read_text())["trainer"]["callbacks"][0]["init_args"]
    cli = cli_main(["--config", str(config), "--trainer.callbacks.init_args.solver=greedy"], run=False)
    [cb] = [c for c in cli.trainer.callbacks if isinstance(c, MemPlanCallback)]
    s = cb._settings
    assert (s.budget, s.backend, s.search_backend) == (init["budget"], init["backend"], init["search_backend"])
    assert s.max_memory == 64 * 2**20 and init["max_memory"] == "64MiB"
    assert s.candidate_budgets == tuple(init["candidate_budgets"])
    assert cb._measure_batches == init["measure_batches"]
    assert s.solver == "greedy"  # the command line overrides the file
