"""What the first training batch shows of the Lightning step, beyond the compiled graphs: how often
``training_step`` calls the planned forward and with which inputs, the inputs it makes itself,
which parameters its loss reaches, and the eager code between the forward and the backward (the
loss on the outputs, metrics), measured. Sizes in bytes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_memplan._torch.fsdp import fsdp2_backward_hooks_inert
from lightning_memplan._torch.storages import tree_leaves
from lightning_memplan.forecasting.autograd_walk import parameters_reached
from lightning_memplan.forecasting.eager_loss import EagerCalls, EagerLoss, measure_eager_losses
from lightning_memplan.forecasting.result import Forecast
from lightning_memplan.planner.messages import MemPlanWarning, eager_forward_warning, uncompiled_warnings
from lightning_memplan.planner.step_model import (
    call_signature,
    fresh_input_bytes,
    input_storages,
    made_input_bytes,
    storage_keys,
)

__all__ = ["FirstBatchProfile", "held_returned"]

Signature = tuple[Any, ...]


def held_returned(losses: tuple[EagerLoss, ...], outputs: Any) -> tuple[EagerLoss, ...]:
    """``losses`` as the outputs ``training_step`` returned (``outputs``) keep them: Lightning keeps
    what it returned (detached, the same storage) through the backward. The outputs of the forward
    that a later compiled region computes the loss from die in that region's backward unless
    returned (``EagerLoss.held_inner_bytes``); those only the loss's autograd nodes saved die as
    its backward runs unless returned (``EagerLoss.saved_outputs``: the returned ones leave it)."""
    if not any(m.inner_outputs or m.saved_outputs for m in losses):
        return losses
    returned = storage_keys(outputs)
    return tuple(dataclasses.replace(m, held_inner_bytes=sum(b for k, b in m.inner_outputs if k in returned),
                                     saved_outputs=tuple((k, b) for k, b in m.saved_outputs if k not in returned))
                 for m in losses)


class FirstBatchProfile:
    """The first batch's calls of the planned forward and the eager code after each.

    The eager-code windows (:class:`~lightning_memplan.forecasting.eager_loss.EagerCalls`) are
    also opened for a later batch of new input shapes, to measure that code at those shapes
    (:meth:`measure` with ``at_shape=True``).
    """

    def __init__(self) -> None:
        #: Calls of the planned forward in the first training batch.
        self.calls = 0
        self._call_inputs: list[dict[int, int]] = []  # per call: storage -> bytes
        #: Per call: its arguments' shapes (``call_signature``).
        self.signatures: list[Signature] = []
        #: The arguments of a call of each other signature than the first call's.
        self.other_calls: dict[Signature, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._before_step: set[int] = set()  # storages live before a step: the batch, parameters, buffers
        #: Bytes of the first call's inputs that training_step made (not in the batch: ``x.float() / 255``).
        self.made_inputs = 0
        #: ``id``s of the parameters the first batch's loss reaches (``None`` until known).
        self.reached: frozenset[int] | None = None
        #: Backward passes in the first batch (manual optimization: possibly several).
        self.backwards = 0
        #: One measurement of the eager code per call of the forward; empty when not measured.
        self.eager_losses: tuple[EagerLoss, ...] = ()
        #: Which batch :attr:`eager_losses` were measured on (for messages).
        self.eager_from = "the first batch"
        #: Bytes of the first call's outputs (to scale the eager code to other shapes).
        self.first_out_bytes = 0
        self.batch: Any = None  # the first batch: its tensors are in the baseline, not the eager loss
        self._outputs: EagerCalls | None = None  # the calls noted so far; None once measured or dropped

    def note_call(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """A training call of the planned forward in the first batch."""
        self.calls += 1
        self._call_inputs.append(input_storages(args, kwargs))
        self.signatures.append(call_signature(args, kwargs))
        if self.signatures[-1] != self.signatures[0]:
            self.other_calls.setdefault(self.signatures[-1], (tuple(args), dict(kwargs)))

    def eager_calls(self, device: torch.device) -> EagerCalls | None:
        """The calls noted (made at the first); ``None`` once an earlier call could not be noted."""
        if self._outputs is None and self.calls <= 1:
            self._outputs = EagerCalls(device)
        return self._outputs

    def region_returned(self, out: Any) -> None:
        """A compiled region of the planned forward returned (see ``EagerCalls.region_returned``)."""
        calls = self._outputs
        if calls is None:
            return
        try:
            calls.region_returned(out)
        except Exception:  # noqa: BLE001 - the call's own outputs are noted instead
            calls.discard_regions()

    def note_outputs(self, out: Any, device: torch.device) -> None:
        """Note a call's outputs (nothing that keeps them alive) and open a window on the eager code
        that follows; when eager code ran after the call's last compiled region, that region's outputs."""
        calls = self.eager_calls(device)
        if calls is None:
            return  # an earlier call could not be noted: nothing is measured for this step
        try:
            calls.returned_after_regions(out)
        except Exception:  # noqa: BLE001 - no eager-loss measurement then
            calls.discard_regions()
            self._outputs = None

    def close_window(self) -> None:
        """End the window on the eager code after the last noted call."""
        if self._outputs is None:
            return
        try:
            self._outputs.close()
        except Exception:  # noqa: BLE001 - no eager-loss measurement then
            self._outputs = None

    def drop_calls(self) -> None:
        """Forget the noted calls (the batch ended, or was measured)."""
        self._outputs = None

    def take_calls(self) -> EagerCalls | None:
        """The noted calls, for a measurement; the profile forgets them."""
        outputs, self._outputs = self._outputs, None
        return outputs

    def backward_starts(self, *, first: bool) -> EagerCalls | None:
        """A backward starts: the window on the eager code after the last noted call ends here (a
        backward pass of the first batch when ``first``). Returns the noted calls, for a
        measurement (:meth:`take_calls`)."""
        self.close_window()
        if first:
            self.backwards += 1
        return self.take_calls()

    def can_measure(self, outputs: EagerCalls | None, loss: Any) -> bool:
        """Whether the eager code between the noted calls (``outputs``) and the backward of ``loss``
        can be measured: every call of the step was noted (as many as the first batch's), at least
        one of them links to autograd, and ``loss`` is a tensor with an autograd graph."""
        return (outputs is not None and len(outputs.calls) == self.calls and any(o.edges for o in outputs.calls)
                and isinstance(loss, torch.Tensor) and loss.grad_fn is not None)

    def finish(self, outputs: Any, module: nn.Module | None) -> None:
        """The first batch ended, ``training_step`` having returned ``outputs``: the storages live
        before a step and the inputs training_step made are known now."""
        self.close_window()  # no backward ran in this batch
        self.eager_losses = held_returned(self.eager_losses, outputs)
        if module is not None:
            self._before_step = storage_keys(self.batch, module)
            self.made_inputs = made_input_bytes(self._call_inputs, self._before_step)
        self.batch = self._outputs = None

    def fresh_input_bytes(self, calls: int) -> list[int] | int:
        """Bytes of the inputs each call after the first got that no earlier call had (another view
        of the batch); 0 when they were not recorded for every call."""
        return fresh_input_bytes(self._call_inputs, calls, self._before_step)

    def parameters_reached(self, loss: torch.Tensor, outputs: EagerCalls, fc: Forecast | None) -> frozenset[int]:
        """``id``s of the parameters the step's backward gives a gradient: those ``loss``'s autograd
        graph reaches, less those a compiled graph reads under ``torch.no_grad()`` (its backward
        returns none for them, though autograd links them to it) and no eager code reads."""
        reached = parameters_reached(loss)
        nograd = fc.compiled_gradless_parameter_ids if fc is not None else None
        if nograd and reached & nograd:
            eager = parameters_reached(loss, stop_at=[e for c in outputs.calls for e in c.edges])
            reached -= nograd - eager
        return frozenset(reached)

    def warn_eager_forward(self, module: nn.Module, loss: torch.Tensor, reached: frozenset[int],
                           outputs: EagerCalls, fc: Forecast | None) -> None:
        """Warn when the loss reaches parameters of the module that neither a compiled graph nor
        the code after the forward's calls read: the forward ran their layers eagerly (unless a
        plainer warning, ``uncompiled_warnings``, said so already)."""
        compiled = fc.compiled_parameter_ids if fc is not None else None
        if compiled is None or uncompiled_warnings(module, fc):
            return
        after = parameters_reached(loss, stop_at=[e for c in outputs.calls for e in c.edges])
        eager = {id(p) for p in module.parameters() if id(p) in reached and id(p) not in compiled | after}
        message = eager_forward_warning(module, eager)
        if message:
            warnings.warn(f"MemPlanCallback: {message}", MemPlanWarning, stacklevel=4)

    def measure(self, loss: torch.Tensor, outputs: EagerCalls, *, lit: nn.Module, module: nn.Module, batch: Any,
                device: torch.device, fsdp2: bool, at_shape: bool) -> tuple[EagerLoss, ...] | None:
        """Measure the eager code between the noted calls' outputs and the backward of ``loss``
        (``batch``: the batch it ran on, whose tensors are in the baseline, as are ``lit``'s
        parameters and buffers); ``None`` when that fails (said on rank zero)."""
        leaves = [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)]
        # in the baseline: the whole LightningModule's parameters and buffers (a head outside the
        # planned submodule saves its weight for backward), and the batch
        baseline = [*lit.parameters(), *lit.buffers(), *module.parameters(), *leaves]
        try:
            with fsdp2_backward_hooks_inert(module) if fsdp2 else contextlib.nullcontext():
                return measure_eager_losses(loss, outputs.now(), exclude=baseline,
                                            forecast_params=module.parameters(), device=device)
        except Exception as exc:  # noqa: BLE001 - the forecast goes on without it
            then = "the first batch's is scaled to these shapes" if at_shape else "the forecast covers the compiled graphs only"
            rank_zero_info(f"MemPlan: the loss on the outputs was not measured ({exc!r}); {then}.")
            return None
