"""``memplan demo`` end to end in a small configuration, plus its model, data and flag checks."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_memplan.cli import main
from lightning_memplan.demo import GPT, GPTConfig, load_corpus, make_dataloader
from lightning_memplan.demo.data import CharDataset, CharTokenizer


def test_corpus_ships_with_the_package_and_round_trips() -> None:
    text = load_corpus()
    assert len(text) > 15_000
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text[:500])) == text[:500]


def test_dataset_windows_shift_targets_by_one() -> None:
    ids = torch.arange(21)
    ds = CharDataset(ids, block_size=5)
    assert len(ds) == 4
    x, y = ds[1]
    assert x.tolist() == [5, 6, 7, 8, 9] and y.tolist() == [6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="block_size=50"):
        CharDataset(ids, block_size=50)


def test_model_shapes_and_config_errors() -> None:
    loader, tok = make_dataloader(16, 4)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=8))
    x, y = next(iter(loader))
    assert model(x).shape == (4, 16, tok.vocab_size)
    with pytest.raises(ValueError, match="n_embd must be a multiple of n_head"):
        GPTConfig(vocab_size=10, n_head=3, n_embd=8)
    with pytest.raises(ValueError, match=r"n_layer=0"):
        GPTConfig(vocab_size=10, n_layer=0)
    with pytest.raises(ValueError, match="'huge'"):
        GPT.from_size("huge", 10)  # type: ignore[arg-type]


def test_demo_cli_trains_plans_reports_and_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--epochs", "2", "--batches", "3", "--candidate-budgets", "1.0", "--remat-budgets", "0.4",
               "--no-progress-bar", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Candidate plans" in out and "chosen" in out
    assert any(line.startswith("remat 0.4  ") for line in out.splitlines())
    # a 100-column terminal shows it whole: only a line holding a file path may be wider
    wide = [line for line in out.splitlines() if len(line) > 100 and str(tmp_path) not in line]
    assert not wide, wide
    assert "predicted peak" in out and "measured peak" in out
    log_dir = next((tmp_path / "demo").glob("version_*"))
    rows = [r for r in csv.DictReader(open(log_dir / "metrics.csv")) if r.get("memplan/budget")]
    assert len(rows) == 2  # one per epoch
    for r in rows:
        assert float(r["memplan/predicted_peak_bytes"]) > 0
        assert float(r["memplan/measured_peak_bytes"]) > 0
    for name in ("frontier.png", "timeline.png"):
        png = log_dir / "memplan" / name
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert str(png) in out  # the demo says where its pictures are


@pytest.mark.parametrize(("argv", "match"), [
    (["--budget", "1.5"], "--budget"),
    (["--solver", "nope"], "--solver"),
    (["--model-size", "huge"], "--model-size"),
])
def test_demo_cli_rejects_bad_flags(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", *argv])
    assert match in capsys.readouterr().err


_PARSE_WITHOUT_TORCH = """
import contextlib, io, json, sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "lightning", "pytorch_lightning"):
            raise ImportError(f"{name} is made unimportable: the flags must be checked first")
sys.meta_path.insert(0, _NoTorch())
from lightning_memplan.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main(["demo", *argv])
            code = 0
        except SystemExit as exc:
            code = exc.code
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_issue_24_demo_checks_every_flag_before_importing_torch(tmp_path: Path) -> None:
    # in a fresh interpreter where torch and lightning cannot be imported: each bad flag is reported
    # by name, with its value and what is allowed, exit code 2, while argparse reads the flags
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["--epochs", "0"], "`--epochs 0` is not valid. Expected a whole number >= 1."),
        (["--batches", "2.5"], "`--batches 2.5` is not valid. Expected a whole number >= 1."),
        (["--budget", "1.5"], "`--budget 1.5` is not valid. Expected 'auto' or a number in [0, 1]."),
        (["--budget", "nan"], "`--budget nan` is not valid."),
        (["--max-memory", "lots"], "`--max-memory lots` is not valid. Expected a byte size such as 16MiB"),
        (["--candidate-budgets", "0.5", "2"], "`--candidate-budgets 2` is not valid. Expected a budget in [0, 1]"),
        (["--remat-budgets", "1.5"], "`--remat-budgets 1.5` is not valid. Expected a budget in [0, 1]"),
        (["--out", str(a_file)], f"`--out {a_file}` is not valid. Expected a directory"),
        (["--solver", "nope"], "argument --solver: invalid choice: 'nope'"),
    ]
    proc = subprocess.run([sys.executable, "-c", _PARSE_WITHOUT_TORCH, json.dumps([argv for argv, _ in cases])],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (argv, message), (code, err) in zip(cases, json.loads(proc.stdout), strict=True):
        assert code == 2, (argv, code, err)
        assert message in err, (argv, err)
        assert "DemoOptions" not in err and "Traceback" not in err
