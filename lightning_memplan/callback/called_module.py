"""The module ``training_step`` calls, found on the first batch when no ``submodule`` is given.

While the first batch runs, every submodule's calls are watched
(:class:`~lightning_memplan.planner.called_modules.CallWatch`): the first module with trainable
parameters that ``training_step`` calls outside ``self(...)`` is planned from that call on, as
``submodule=`` would plan it. When the batch ends, the modules it also called outside the planned
one are named (a warning when one of them holds more trainable parameters).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_memplan.planner.called_modules import CallWatch, ModuleCall, also_called
from lightning_memplan.planner.messages import MemPlanWarning

__all__ = ["FirstBatchCalls"]


class FirstBatchCalls:
    """The watch of ``training_step``'s module calls on the first batch. Invariant: once
    :meth:`end` or :meth:`close` ran, every module's ``forward`` is as it was before :meth:`open`."""

    def __init__(self) -> None:
        self._watch: CallWatch | None = None

    def open(self, lit: nn.Module, plan: Callable[[ModuleCall], Callable[..., Any] | None]) -> None:
        """Watch the calls of ``lit``'s submodules; ``plan(call)`` is asked at the first call of a
        module with trainable parameters: the planned forward to run instead, or ``None`` (it runs
        as written, and the next such call is asked)."""
        self._watch = CallWatch(lit, lambda call, _: plan(call)).open()

    def lightning_module_called(self) -> None:
        """``training_step`` called ``self(...)`` before any submodule: the LightningModule is
        planned, so no submodule is (the calls noted so far are kept for :meth:`end`)."""
        if self._watch is not None and self._watch.chosen is None:
            self._watch.close()

    def end(self, *, verbose: bool) -> list[ModuleCall]:
        """The first batch ended: stop watching and name the modules called outside the planned one
        (a warning when one is larger; else a line when ``verbose``). Returns the outermost module
        calls the batch made, in order (empty when nothing was watched)."""
        watch, self._watch = self._watch, None
        if watch is None:
            return []
        watch.close()
        said = also_called(watch.chosen, watch.calls) if watch.chosen is not None else None
        if said is not None and said[1]:
            warnings.warn(f"MemPlanCallback: {said[0]}", MemPlanWarning, stacklevel=4)
        elif said is not None and verbose:
            rank_zero_info(f"MemPlan: {said[0]}")
        return watch.calls

    def close(self) -> None:
        """Stop watching, saying nothing (the fit ended early); nothing when not watching."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
