"""``memplan estimate`` and :func:`lightning_memplan.planner.estimate.estimate_plans`: every plan of a
transformers model built from a local config on the meta device, for a named target, nothing
allocated; bad input refused naming the flag."""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lightning_memplan.cli import main
from lightning_memplan.planner.estimate import LabelledStep, estimate_plans

pytest.importorskip("transformers")

_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128}


@pytest.fixture()
def llama_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_LLAMA))
    return path


def test_estimate_json_has_every_plan_and_the_fastest_that_fits(llama_config: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--config", str(llama_config), "--model-class", "LlamaForCausalLM", "--batch", "2",
                 "--seq", "32", "--target", "H100", "--budgets", "1.0", "0.3", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == "H100" and out["limit_bytes"] == 80 * 10**9 - 512 * 2**20
    plans = {r["plan"] for r in out["rows"]}
    assert plans == {"budget 1.00", "budget 0.30", "budget 1.00 + 2 blocks ckpt", "budget 0.30 + 2 blocks ckpt"}
    for r in out["rows"]:
        assert r["reserved"] >= r["allocated"] >= r["requested"] > r["parameters"] > 0 and r["fits"] is True
        assert r["optimizer_state"] >= 2 * r["parameters"] * 0.99  # AdamW: two float32 states per parameter
    assert out["best"] == "budget 1.00" and "fastest plan that fits H100" in out["summary"]


def test_estimate_table_with_a_limit_nothing_fits(llama_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--config", str(llama_config), "--model-class", "LlamaForCausalLM", "--seq", "32",
                 "--target", "cpu", "--max-memory", "1MiB", "--budgets", "1.0", "--no-checkpoint"])
    text = capsys.readouterr().out
    assert code == 0 and "No plan fits cpu (1.00 MiB, max_memory)" in text and " no\n" in text + "\n"
    table = text.splitlines()[1:]  # after the line naming the model
    assert all(len(line) <= 100 for line in table if not line.startswith(("note:", "No plan")))
    row = next(line for line in table if line.startswith("budget 1.00"))
    assert len(row.split()) == 2 + 5 * 2 + 2, row  # every figure and its unit apart, even "1002.27 KiB"


def test_estimate_from_a_factory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Step(nn.Module):
            def __init__(self, seq):
                super().__init__()
                self.net = nn.Sequential(nn.Embedding(100, 32), nn.Flatten(), nn.Linear(32 * seq, 1))

            def forward(self, ids):
                return self.net(ids).square().mean()

        def make_step(batch, seq):
            return Step(seq), (torch.randint(0, 100, (batch, seq)),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["estimate", "--factory", "my_models:make_step", "--batch", "4", "--seq", "8", "--optimizer", "sgd",
                 "--target", "cpu", "--max-memory", "1GiB", "--budgets", "1.0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["best"] == "budget 1.00" and out["rows"][0]["optimizer_state"] > 0  # momentum
    sys.modules.pop("my_models", None)


@pytest.mark.parametrize(("argv", "message"), [
    (["--config", "{cfg}", "--model-class", "LlamaForCausalLN"], r"`--model-class LlamaForCausalLN` is not a model "
                                                                 r"class of transformers .* Did you mean 'LlamaForCausalLM'"),
    (["--config", "{cfg}"], r"`--config` needs `--model-class`"),
    (["--config", "{bad}", "--model-class", "LlamaForCausalLM"], r"`--config .*bad.json` is not a readable "
                                                                 r"transformers config"),
    (["--factory", "no_such_module:make"], r"`--factory no_such_module:make` could not be loaded"),
    (["--factory", "nocolon"], r"`--factory nocolon` is not valid. Expected module:function"),
])
def test_estimate_bad_input_names_the_flag(argv: list[str], message: str, llama_config: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    argv = [a.format(cfg=llama_config, bad=bad) for a in argv]
    assert main(["estimate", *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_estimate_unknown_target_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["estimate", "--factory", "m:f", "--target", "H1000"])
    assert "`memplan estimate(--target='H1000')` is not a known device" in capsys.readouterr().err


def test_estimate_plans_from_python_on_a_meta_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        step = LabelledStep(LlamaForCausalLM(LlamaConfig(**_LLAMA, use_cache=False))).train()
        ids = torch.randint(0, 512, (2, 32))
    table = estimate_plans(step, (ids, ids), target="T4", loss_fn=lambda loss: loss, budgets=(1.0, 0.1),
                           optimizer=torch.optim.AdamW(step.parameters()))
    assert table.limit == 16 * 10**9 - 512 * 2**20 and table.best is table.rows[0] and not table.skipped
    assert table.rows[0].extra_compute == 0.0 and all(r.extra_compute >= 0 for r in table.rows)
    assert any(r.checkpointed == ("model.model.layers.0", "model.model.layers.1") for r in table.rows)
    assert all(p.device.type == "meta" for p in step.parameters())
