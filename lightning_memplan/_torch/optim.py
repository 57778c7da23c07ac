"""torch's optimizers: the implementation (fused, foreach) they pick by default for given parameters.

Raises the :class:`RuntimeError` of :func:`~lightning_memplan._torch.version.require` when this
torch lacks the private helper.
"""
from __future__ import annotations

import torch

from lightning_memplan._torch.version import require

__all__ = [
    "default_fused_or_foreach",
]


def default_fused_or_foreach(params: list[torch.Tensor]) -> tuple[bool, bool]:
    """``(fused, foreach)`` that torch's optimizers pick by default for these parameters."""
    fn = require("torch.optim.optimizer", "_default_to_fused_or_foreach")
    fused, foreach = fn(params, differentiable=False, use_fused=False)
    return bool(fused), bool(foreach)
