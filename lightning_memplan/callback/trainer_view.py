"""The few facts of the running Trainer that planning needs, behind one small object, so the parts
of the callback take a :class:`TrainerView` (and tests a view without a Trainer) instead of the
Trainer itself."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn

from lightning_memplan.planner.step_model import TrainingLoop, gradless_bytes, other_optimizer_state_bytes

__all__ = ["TrainerView"]


class TrainerView:
    """``trainer`` (``None``: no Trainer, e.g. in unit tests: one process, no optimizer, no
    precision plugin) running ``lit``, whose planned module is ``module`` (set when attached)."""

    def __init__(self, trainer: Trainer | None, lit: LightningModule | None) -> None:
        self.trainer = trainer
        self.lit = lit
        self.module: nn.Module | None = None
        self._other_state: int | None = None  # bytes of the state of the optimizers after the first

    @property
    def strategy(self) -> Any:
        return self.trainer.strategy if self.trainer is not None else None

    @property
    def world_size(self) -> int:
        return int(getattr(self.strategy, "world_size", 1) or 1)

    def training(self) -> bool:
        """Whether the Trainer trains now (else whether the planned module is in training mode)."""
        if self.trainer is not None:
            return bool(self.trainer.training)
        return self.module is not None and self.module.training

    def training_call(self) -> bool:
        """Whether a forward called now belongs to a training step: the Trainer trains and
        autograd records (not a validation step, nor a call under ``torch.no_grad()``)."""
        return self.training() and torch.is_grad_enabled()

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(getattr(self.trainer, "optimizers", []) or []) if self.trainer is not None else []

    def optimizer(self) -> torch.optim.Optimizer | None:
        """The first optimizer (the one the planned module's parameters step with), if any."""
        opts = self.optimizers()
        return opts[0] if opts else None

    def loop(self, reached: frozenset[int] | None) -> TrainingLoop:
        """How the Trainer runs the training step (accumulation, manual optimization), with the
        bytes of the planned module's trainable parameters outside ``reached`` (the ids of those
        the first batch's loss reached; ``None``/empty: all get gradients) and of the other
        optimizers' state (read once: the optimizers are set up before the first batch)."""
        loop = TrainingLoop.of(self.trainer, self.lit, self.module)
        if self._other_state is None:
            self._other_state = other_optimizer_state_bytes(self.optimizers())
        gradless = gradless_bytes(self.module, reached) if self.module is not None and reached else 0
        return dataclasses.replace(loop, gradless_bytes=gradless, other_optimizer_state_bytes=self._other_state)

    def step_context(self) -> contextlib.AbstractContextManager[Any]:
        """The precision plugin's training-step context (autocast for ``"bf16-mixed"``): a forecast
        made outside the training step runs the forward as the step does. Inside the step it is
        entered once more, which changes nothing."""
        if self.trainer is None:
            return contextlib.nullcontext()
        return self.trainer.precision_plugin.train_step_context()

    def device(self) -> torch.device:
        """The planned module's device (``cpu`` or ``cuda``; others count as ``cpu``)."""
        param = next(self.module.parameters(), None) if self.module is not None else None
        dev = param.device if param is not None else torch.device("cpu")
        return dev if dev.type in ("cpu", "cuda") else torch.device("cpu")
