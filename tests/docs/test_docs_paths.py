"""Every dotted ``lightning_memplan...`` path that the README and docs/ name resolves: to a module,
or to an attribute of one (so a moved module cannot leave the docs pointing nowhere)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _resolves(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_path_the_docs_name_resolves() -> None:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    paths = {m for t in texts for m in re.findall(r"lightning_memplan(?:\.[A-Za-z_]\w*)+", t.read_text())}
    assert len(paths) >= 10
    assert sorted(p for p in paths if not _resolves(p)) == []
