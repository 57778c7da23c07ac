"""Where autograd is: whether the current thread runs a backward pass."""
from __future__ import annotations

import torch

__all__ = ["in_backward"]


def in_backward() -> bool:
    """Whether the calling thread runs inside a backward pass (autograd's graph task id is set),
    e.g. a region's forward called again to recompute a checkpointed block."""
    return int(torch._C._current_graph_task_id()) != -1
