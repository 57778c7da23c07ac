"""Which graphs dynamo compiled for a planned forward after its first call, and why that matters.

A plan is forecast, and its activations chosen, at the sizes of the batch it was decided on. Dynamo
compiles the forward again when a call's inputs no longer match a cached graph's guards: a smaller
last batch (``DataLoader(drop_last=False)``, the default), inputs that change length, a call without
grad (validation). With torch's default ``dynamic=None`` the second distinct size makes it compile a
*dynamic-shape* graph, which dynamo then prefers over the planned one for every size, and whose
partition was decided at the sizes of the batch that caused it (a last batch of 5 rows instead of
64: the budget's knapsack saw activations smaller than the inputs and saved everything). This
module only observes: :class:`WatchedBackend` notes every compile and hands it on unchanged.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from lightning_memplan.text import listed

__all__ = ["CompileRecord", "WatchedBackend", "describe_shapes"]


@dataclass(frozen=True)
class CompileRecord:
    """One graph dynamo handed to the backend (a forward with graph breaks hands several)."""

    #: Shapes (in elements) of the graph's tensor inputs that are not parameters, in order; a
    #: dimension dynamo made symbolic is given at the size of the call that compiled it.
    input_shapes: tuple[tuple[int, ...], ...]
    #: Whether dynamo compiled it with symbolic sizes (automatic dynamic shapes, ``dynamic=True``).
    dynamic: bool
    #: Whether it was compiled for training (the ``training`` callable said so, e.g. the Trainer's
    #: state, and grad mode was on); ``False`` for validation's inference graphs.
    training: bool


def describe_shapes(shapes: Sequence[tuple[int, ...]], limit: int = 3) -> str:
    """``"[64, 32], [64, 1]"``: the first ``limit`` shapes, then how many more."""
    return listed([str(list(s)) for s in shapes], limit)


class WatchedBackend:
    """A dynamo backend that records a :class:`CompileRecord` for every graph it is given, then
    returns ``inner(gm, example_inputs)`` unchanged (a failure of ``inner`` propagates as before).

    ``training``: called at each compile; whether the model is being trained (the caller's notion,
    e.g. ``trainer.training``). Grad mode is checked besides.

    :attr:`on_output`, when set, is called with the outputs of every compiled graph it returned, each
    time one runs (a forward with graph breaks runs several per call); ``None`` costs one attribute
    read per call.
    """

    def __init__(self, inner: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
                 training: Callable[[], bool]) -> None:
        self.inner = inner
        self._training = training
        #: Every graph compiled so far, in order.
        self.compiles: list[CompileRecord] = []
        #: Called with each compiled graph's outputs when it runs, while set.
        self.on_output: Callable[[Any], None] | None = None

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        shapes = tuple(tuple(int(d) for d in e.shape) for e in example_inputs
                       if isinstance(e, torch.Tensor) and not isinstance(e, nn.Parameter))
        dynamic = any(isinstance(e, torch.SymInt) for e in example_inputs)
        try:
            training = bool(self._training()) and torch.is_grad_enabled()
        except Exception:  # noqa: BLE001 - an observer never stops a compile
            training = torch.is_grad_enabled()
        self.compiles.append(CompileRecord(input_shapes=shapes, dynamic=dynamic, training=training))
        compiled = self.inner(gm, example_inputs)

        def watched_region(*args: Any, **kwargs: Any) -> Any:
            out = compiled(*args, **kwargs)
            observe = self.on_output
            if observe is not None:
                observe(out)
            return out

        return watched_region

    def __repr__(self) -> str:
        return f"WatchedBackend({self.inner!r}, compiles={len(self.compiles)})"
