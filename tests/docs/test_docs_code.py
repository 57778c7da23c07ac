"""The README's and docs' Python blocks run as written.

Each page's blocks run in order in one fresh interpreter (a later block may use an earlier one's
names), in a temporary directory. A block that cannot run alone (a signature with its defaults, or
code on the reader's own model) is preceded by ``<!-- docs-test: not run (why) -->``; the README's
and the quickstart's blocks never are.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:^(<!-- docs-test: not run \((?P<why>[^)]+)\) -->)\n)?^```python\n(?P<code>.*?)^```$",
                    re.MULTILINE | re.DOTALL)
_MUST_RUN = {"README.md", "quickstart.md"}


def _blocks(page: Path) -> list[tuple[str, str | None]]:
    """``(code, why it is not run or None)`` of every Python block of ``page``, in order."""
    return [(m["code"], m["why"]) for m in _BLOCK.finditer(page.read_text())]


def _runnable(page: Path) -> str:
    """The page's runnable blocks joined into one program; blocks an earlier page already ran as
    they are (the README repeats the quickstart's program) are left out."""
    seen = {code for p in PAGES[: PAGES.index(page)] for code, why in _blocks(p) if why is None}
    return "\n".join(code for code, why in _blocks(page) if why is None and code not in seen)


def test_every_python_block_is_found_and_the_first_pages_run_all_of_theirs() -> None:
    blocks = {p.name: _blocks(p) for p in PAGES}
    fenced = {p.name: p.read_text().count("```python") for p in PAGES}
    assert {name: len(b) for name, b in blocks.items()} == fenced  # no block missed by the pattern
    assert all(why is None for name in _MUST_RUN for _, why in blocks[name])
    assert "MemPlanCallback()" in _runnable(ROOT / "README.md")  # the whole program is a block of its own


@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p).strip()], ids=lambda p: p.name)
def test_page_code_runs_as_written(page: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _runnable(page)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, f"{page.name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
