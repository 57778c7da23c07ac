"""A sum of tensors that keeps every one of them allocated until all are made, under every
backend: ``materialized_sum(ts)``.

A forecast compiles the planned forward together with a stand-in loss that sums its outputs, so
every output has a gradient. In the forward the user's step compiles, every output is returned:
allocated, and alive until the forward ends. Summed one by one, each output of the forecast's graph
is a tensor a reduction reads, which inductor may fuse into the kernel making it or schedule right
after it (its memory-aware reordering does), so it dies early: a KV cache's keys and values were
freed mid-forward, the forecast that many bytes low. ``memplan::materialized_sum`` is a custom op
over all the outputs at once: inductor runs it as one extern kernel on realized buffers, after the
last output is made, as the end of the user's forward. Under aot_eager it is one node reading every
output, as the sums at the graph's end were. Each output's gradient is the incoming scalar gradient
expanded to its shape, as ``sum``'s.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["materialized_sum"]


@torch.library.custom_op("memplan::materialized_sum", mutates_args=())
def _materialized_sum(ts: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32, device=ts[0].device)
    for t in ts:
        total = total + t.sum(dtype=torch.float32)
    return total


@_materialized_sum.register_fake
def _(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0].new_empty((), dtype=torch.float32)


def _setup(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[list[torch.Tensor]], output: torch.Tensor) -> None:
    (ts,) = inputs
    ctx.metas = [(t.shape, t.dtype) for t in ts]  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> list[torch.Tensor]:
    return [grad.to(dtype).expand(shape) for shape, dtype in ctx.metas]  # type: ignore[attr-defined]


_materialized_sum.register_autograd(_backward, setup_context=_setup)


def materialized_sum(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of every element of ``ts`` (non-empty, floating point) as a float32 scalar, each
    allocated until all are made, under every backend (module docstring)."""
    if not ts:
        raise ValueError("materialized_sum: `ts` is empty")
    return _materialized_sum(list(ts))
