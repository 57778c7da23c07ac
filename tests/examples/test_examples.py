"""Every example runs as written, in its fast mode, in a fresh process; the LightningCLI example is
also the check that MemPlanCallback is configurable from YAML."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(cwd: Path, *argv: str, timeout: int = 600) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


#: Each example's command line (its fast mode). They run two at a time, one thread each, from the
#: first test of this module on: each is a fresh process that mostly compiles on one core.
RUNS: dict[str, tuple[str, ...]] = {
    "basic_use": (str(EXAMPLES / "basic_use.py"), "--fast"),
    "byte_target": (str(EXAMPLES / "byte_target.py"), "--fast", "--max-memory", "64MiB"),
    "tune_then_train": (str(EXAMPLES / "tune_then_train.py"), "--fast"),
    "lightning_cli": (str(EXAMPLES / "lightning_cli.py"), "fit", "--config", str(EXAMPLES / "lightning_cli.yaml"),
                      "--fast"),
    "ddp_cpu": (str(EXAMPLES / "ddp_cpu.py"), "--fast"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Future[str]]]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = {}
        for name in ("ddp_cpu", *(n for n in RUNS if n != "ddp_cpu")):  # the longest first
            cwd = tmp_path_factory.mktemp(name)
            started[name] = (cwd, pool.submit(_run, cwd, *RUNS[name]))
        yield started


def _result(runs: dict[str, tuple[Path, Future[str]]], name: str) -> tuple[Path, str]:
    cwd, future = runs[name]
    return cwd, future.result()


def test_basic_use(runs: dict[str, tuple[Path, Future[str]]]) -> None:
    cwd, out = _result(runs, "basic_use")
    assert "plan: budget" in out and "chosen by knee" in out
    assert list(cwd.glob("memplan_out/lightning_logs/version_0/memplan/frontier.png"))


def test_byte_target(runs: dict[str, tuple[Path, Future[str]]]) -> None:
    _, out = _result(runs, "byte_target")
    assert "cheapest plan within max_memory 64.00 MiB" in out


def test_tune_then_train(runs: dict[str, tuple[Path, Future[str]]]) -> None:
    cwd, out = _result(runs, "tune_then_train")
    plan = json.loads((cwd / "memplan_out" / "plan.json").read_text())
    assert f"trained with budget {plan['budget']:g} from" in out
    # the fast mode's two budgets (no checkpointing), then the search's whole-graph remat plans
    assert [c["solver"] for c in plan["candidates"]] == ["", "", "remat", "remat", "remat"]


def test_lightning_cli_fits_from_yaml(runs: dict[str, tuple[Path, Future[str]]]) -> None:
    cwd, out = _result(runs, "lightning_cli")
    log_dir = cwd / "memplan_out" / "lightning_logs" / "version_0"
    # the timeline is drawn once a batch was measured; the config LightningCLI saved is the YAML's
    assert (log_dir / "memplan" / "timeline.png").is_file(), out[-2000:]
    assert "lightning_memplan.MemPlanCallback" in (log_dir / "config.yaml").read_text()


def test_ddp_cpu_two_processes(runs: dict[str, tuple[Path, Future[str]]]) -> None:
    _, out = _result(runs, "ddp_cpu")
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


def test_a_cli_fit_plans_the_module_training_step_calls(tmp_path: Path) -> None:
    """LightningCLI builds the Trainer and the callback (its default arguments but the CPU backend)
    from its configuration; the LightningModule holds its network as ``self.model`` and training_step
    calls ``self.model(x)``, no ``submodule=`` given: the callback finds that module on the first
    batch and plans it, as it does without the CLI."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures]")
    from lightning.pytorch.cli import LightningCLI

    from lightning_memplan import MemPlanCallback

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "callback"))
    try:
        from models import Wrapper
    finally:
        sys.path.pop(0)
    config = {"trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "logger": False,
                          "enable_checkpointing": False, "enable_progress_bar": False,
                          "enable_model_summary": False, "default_root_dir": str(tmp_path),
                          "callbacks": [{"class_path": "lightning_memplan.MemPlanCallback",
                                         "init_args": {"backend": "aot_eager"}}]}}
    cli = LightningCLI(Wrapper, args=config, run=False, save_config_callback=None)
    [cb] = [c for c in cli.trainer.callbacks if isinstance(c, MemPlanCallback)]
    cli.trainer.fit(cli.model)
    assert cb.fallback_reason is None and cb.plan is not None and cb.plan.predicted_peak_bytes
    assert cb._fit.planned.startswith("`model` (TinyNet): the first module"), cb._fit.planned
    [measured] = cb.measured
    assert measured and all(abs(cb.plan.predicted_peak_bytes - m) / m < 0.03 for m in measured), (cb.plan, measured)
