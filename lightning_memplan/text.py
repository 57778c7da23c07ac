"""Plain-text helpers for messages and tables."""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["listed"]


def listed(texts: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``texts`` joined with ``", "``, then ``" and N more"`` for the rest."""
    more = f" and {len(texts) - shown} more" if len(texts) > shown else ""
    return ", ".join(texts[:shown]) + more
