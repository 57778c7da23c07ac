"""The graphs dynamo compiled for training after the planned one, reported as they come."""
from __future__ import annotations

import warnings

from lightning.pytorch.utilities import rank_zero_info

from lightning_memplan._torch.dynamo import recompile_limit
from lightning_memplan.callback.compile_watch import CompileRecord, WatchedBackend, describe_shapes
from lightning_memplan.planner.messages import MemPlanWarning

__all__ = ["RecompileWatch"]


class RecompileWatch:
    """Follows the :class:`~lightning_memplan.callback.compile_watch.WatchedBackend` of the plan in
    force: :attr:`recompiles` lists the training graphs compiled after the planned one(s), in
    order; :attr:`planned_shapes` are the planned graph's input shapes (elements)."""

    def __init__(self, *, verbose: bool) -> None:
        self._verbose = verbose
        self.backend: WatchedBackend | None = None
        self._seen = 0  # compiles of the backend already looked at
        self.planned_shapes: tuple[tuple[int, ...], ...] | None = None
        #: Graphs compiled for training after the planned one(s), in order: dynamo compiled the
        #: forward again for inputs of other shapes (a smaller last batch, inputs of varying length).
        self.recompiles: list[CompileRecord] = []
        self._warned_dynamic = self._warned_shapes = False

    def follow(self, backend: WatchedBackend, planned_shapes: tuple[tuple[int, ...], ...]) -> None:
        """Follow the backend of a newly installed plan, compiled for ``planned_shapes``."""
        self.backend, self._seen, self.planned_shapes = backend, 0, planned_shapes

    def planned_compiled(self) -> CompileRecord | None:
        """After the plan's first call: its first graph, with every graph so far counted as planned."""
        if self.backend is None or not self.backend.compiles:
            return None
        self._seen = len(self.backend.compiles)
        return self.backend.compiles[0]

    def check(self, batch: int) -> list[CompileRecord]:
        """Report the graphs compiled for training since the last look: a line per new graph (rank
        zero); a warning for a dynamic-shape graph (it replaces the planned one) and once when the
        inputs keep changing shape. ``batch``: the fit's batch number, for messages. Returns the
        new graphs (those appended to :attr:`recompiles`)."""
        backend = self.backend
        if backend is None or len(backend.compiles) <= self._seen:
            return []
        new = [r for r in backend.compiles[self._seen:] if r.training]
        self._seen = len(backend.compiles)
        planned = describe_shapes(self.planned_shapes or ())
        for record in new:
            self.recompiles.append(record)
            if record.dynamic and not self._warned_dynamic:
                self._warned_dynamic = True
                warnings.warn(
                    f"MemPlanCallback: batch {batch} compiled a dynamic-shape graph (inputs "
                    f"{describe_shapes(record.input_shapes)}), because compile_kwargs allow dynamic shapes. "
                    "Dynamo now runs it for every batch size, and the partitioner chose its saved activations "
                    f"at the sizes of that batch, not at the planned {planned}: the plan and its forecast no "
                    "longer hold (memplan/measured_peak_bytes will show it). Leave `dynamic` out of "
                    "compile_kwargs (the callback compiles with dynamic=False), or drop the incomplete last "
                    "batch (DataLoader(drop_last=True)).", MemPlanWarning, stacklevel=4)
            elif self._verbose:
                rank_zero_info(f"MemPlan: batch {batch}: the forward was compiled again, with the "
                               f"plan, for inputs {describe_shapes(record.input_shapes)} (forecast: {planned})")
        shapes = {r.input_shapes for r in self.recompiles if not r.dynamic}
        limit = recompile_limit()
        if not self._warned_shapes and len(shapes) >= max(2, limit // 2):
            self._warned_shapes = True
            warnings.warn(
                f"MemPlanCallback: the inputs keep changing shape ({len(shapes)} new shapes after the planned "
                f"{planned}). Each new shape compiles a static graph with the plan (and, with "
                f"forecast_new_shapes, a forecast of its own), until dynamo's recompile_limit ({limit}); after "
                "that new shapes run uncompiled, without the plan or a forecast. Pad inputs of varying length "
                "to a few fixed lengths (buckets), or raise torch._dynamo.config.recompile_limit to their "
                "number.", MemPlanWarning, stacklevel=4)
        return new
