"""Plain-text helpers for messages and tables."""
from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

__all__ = ["COLUMNS", "fill", "listed"]

COLUMNS = 100
"""The terminal width, in characters, that the tables and messages a person reads are laid out for."""


def listed(texts: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``texts`` joined with ``", "``, then ``" and N more"`` for the rest."""
    more = f" and {len(texts) - shown} more" if len(texts) > shown else ""
    return ", ".join(texts[:shown]) + more


#: A number and its unit (``7.93 MiB``, ``5.7 s``), which :func:`fill` keeps on one line.
_QUANTITY = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|s)\b")


def fill(text: str, width: int = COLUMNS, indent: str = "  ") -> str:
    """``text`` with each of its lines longer than ``width`` characters broken at spaces (never
    between a number and its unit), the continuation lines indented by the line's own leading
    spaces plus ``indent``. A word longer than a line (a file path, a URL) is kept whole, so such a
    line may stay wider."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        kept = _QUANTITY.sub("\\1\xa0\\2", line.strip())  # a no-break space: textwrap does not split at it
        out.append(textwrap.fill(kept, width, initial_indent=lead, subsequent_indent=lead + indent,
                                 break_long_words=False, break_on_hyphens=False).replace("\xa0", " "))
    return "\n".join(out)
