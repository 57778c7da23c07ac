"""benchmarks/gpu_check.py and benchmarks/device_check.sh: each exits 0 with a clear line on a machine
without CUDA, and their code paths run end to end on the CPU (``gpu_check.py --smoke``,
``device_check.sh --dry-run``: tiny sizes; the numbers are not a measurement of any GPU)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for minutes")
def test_without_cuda_it_says_so_and_exits_0() -> None:
    proc = _run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no CUDA device" in proc.stdout


def test_smoke_run_prints_every_section_and_the_summary() -> None:
    proc = _run("--smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for marker in ("[1/3] forecast", "[2/3] plans", "[3/3] knapsack solvers", "Summary", "memplan bench exit code 0"):
        assert marker in out, out[-3000:]
    assert "full block ckpt" in out and "remat 0.4" in out and "auto (" in out
    assert "failed:" not in out, out[-3000:]
    assert "1/1 rows" in out  # the forecast row ran and produced an error figure


def _device_check(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.parent / "device_check.sh"
    env = dict(os.environ, OUT=str(tmp_path), PYTHONWARNINGS="ignore",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("GPU_CHECK_SECONDS", None)
    return subprocess.run(["bash", str(script), *argv], capture_output=True, text=True, env=env, timeout=900,
                          cwd=SCRIPT.parents[1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for minutes")
def test_device_script_runs_its_steps_and_writes_its_logs(tmp_path: Path) -> None:
    proc = _device_check(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tests = (tmp_path / "pytest_cuda.txt").read_text()
    # every CUDA test found, none runs here
    assert "SKIPPED" in tests and "FAILED" not in tests and "ERROR" not in tests, tests
    for n in (2, 3, 4, 5):
        assert "no CUDA device" in (tmp_path / f"section_{n}.txt").read_text()
    assert proc.stdout.rstrip().splitlines()[-1] == "sections run: 1 of 5", proc.stdout[-3000:]
    assert (tmp_path / "device_check.txt").read_text() == proc.stdout  # everything printed is kept under $OUT


@pytest.mark.slow
def test_device_script_dry_run_runs_every_section_on_the_cpu(tmp_path: Path) -> None:
    proc = _device_check(tmp_path, "--dry-run")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for header in ("[1/5] CUDA-only tests", "[2/5] the real-model zoo", "[3/5] plans on a GPU",
                   "[4/5] forecasts that allocate nothing", "[4/5] compared with section 3's real run",
                   "[5/5] the batch-size planner", "Summary (dry run"):
        assert header in out, out[-3000:]
    assert "not available yet" not in out
    assert "failed:" not in out and "Traceback" not in out, out[-5000:]  # no row or section failed
    assert "auto (" in out and "full block ckpt" in out and "estimate_plans" in out
    # section 5: both finders ran, ours without a training step, and its fit was measured
    ours = r"\| llama +\| [\d.]+ MiB +\| MemPlanCallback +\| 0 +\| [\d.]+ +\| \d+ +\| [\d.]+ MiB +\| yes"
    assert re.search(ours, out), out[-3000:]
    assert re.search(r"\| llama +\| [\d.]+ MiB +\| BatchSizeFinder +\| [1-9]\d* +\|", out), out[-3000:]
    assert out.rstrip().splitlines()[-1] == "sections run: 5 of 5", out[-3000:]
    assert (tmp_path / "device_check.txt").read_text() == out
    for n in range(1, 6):
        assert (tmp_path / f"section_{n}.json").exists()
