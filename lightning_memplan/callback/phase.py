"""Where a fit stands, in training batches: before the first, the first (it decides, compiles and
profiles the step), or a later one."""
from __future__ import annotations

import enum

__all__ = ["FitProgress", "Phase"]


class Phase(enum.Enum):
    #: No training batch has started yet.
    BEFORE = "before the first batch"
    #: The fit's first training batch: the plan is decided and compiled, the step profiled.
    FIRST = "first batch"
    #: Any later training batch: measured, and forecast again at new input shapes.
    LATER = "later batch"


class FitProgress:
    """Training batches started in this fit (``batches``, counting from 1 at the first)."""

    def __init__(self) -> None:
        self.batches = 0

    def start_batch(self) -> None:
        self.batches += 1

    @property
    def phase(self) -> Phase:
        return Phase.BEFORE if self.batches == 0 else Phase.FIRST if self.batches == 1 else Phase.LATER

    @property
    def first(self) -> bool:
        return self.batches == 1

    @property
    def later(self) -> bool:
        return self.batches > 1
