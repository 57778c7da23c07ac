"""The profiler's memory events: what :mod:`lightning_memplan.measure` reads of a CPU profile.

Raises a :class:`RuntimeError` naming the missing part when this torch's profiler results differ.
"""
from __future__ import annotations

from typing import Any

import torch

from lightning_memplan._torch.version import MIN_TORCH, require

__all__ = [
    "kineto_memory_events",
]


def kineto_memory_events(prof: Any) -> list[tuple[int, int]]:
    """``(start_ns, signed bytes)`` of every CPU ``[memory]`` event of a finished profiler run."""
    device_type = require("torch.autograd", "DeviceType")
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as err:
        raise RuntimeError(
            f"lightning_memplan reads `profiler.kineto_results.events()`, missing in torch "
            f"{torch.__version__!r}; supported: torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}."
        ) from err
    out = [(int(e.start_ns()), int(e.nbytes())) for e in events
           if e.name() == "[memory]" and e.device_type() == device_type.CPU]
    out.sort(key=lambda item: item[0])
    return out
