"""The documentation site builds with ``mkdocs build --strict``: a broken link, a broken anchor
or a page missing from the nav fails the build (see mkdocs.yml's ``validation``)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[test]')")
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "api" / "index.html").is_file()


def test_every_metric_key_of_the_callback_is_documented() -> None:
    """docs/metrics.md lists every ``memplan/*`` key the callback's docstring promises."""
    callback_src = (ROOT / "lightning_memplan" / "callback" / "memplan_callback.py").read_text()
    keys = set(re.findall(r"``(memplan/[a-z_]+)``", callback_src))
    assert len(keys) >= 10
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    assert {k for k in keys if f"`{k}`" not in metrics_doc} == set()


def test_every_callback_argument_is_documented() -> None:
    import inspect

    from lightning_memplan import MemPlanCallback

    api = (ROOT / "docs" / "api.md").read_text()
    args = [a for a in inspect.signature(MemPlanCallback).parameters if a != "self"]
    assert [a for a in args if f"| `{a}` |" not in api] == []
