"""``torch.compile`` and dynamo: compile options, dynamo's settings, lazily generated graph modules.

Every function reads torch when called. A missing optional setting gives its default (``{}``, 8,
True, a plain ``GraphModule``) or is left alone (:func:`graph_caches_off_patch`), never an error;
every patch is restored on exit.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lightning_memplan._torch.version import require

_R = TypeVar("_R")

__all__ = [
    "breaking_call",
    "dynamo_allows_rnn",
    "frame_mutations",
    "graph_caches_off_patch",
    "isolated_compile_kwargs",
    "lazy_graph_module",
    "recompile_limit",
    "with_dynamo_settings",
]


def isolated_compile_kwargs() -> dict[str, Any]:
    """``{"isolate_recompiles": True}`` where ``torch.compile`` takes it (torch >= 2.13), else ``{}``.

    Every forecast compiles the model's code again with a new backend. Frames dynamo compiles on
    their own (the code after a graph break, an FSDP unit's forward) keep their entries from every
    earlier forecast, so after a few forecasts of one model they hit ``recompile_limit`` (8) and run
    uncompiled, unseen by the forecast. Isolated, each compile call keeps its own entries.
    """
    import inspect

    try:
        supported = "isolate_recompiles" in inspect.signature(torch.compile).parameters
        return {"isolate_recompiles": True} if supported else {}
    except (TypeError, ValueError):
        return {}


def recompile_limit() -> int:
    """dynamo's per-code-object limit of compiled graphs (``recompile_limit``; ``cache_size_limit``
    before torch 2.6); 8, its default, if neither is readable."""
    try:
        import torch._dynamo.config as config

        return int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))
    except Exception:  # noqa: BLE001
        return 8


def dynamo_allows_rnn() -> bool:
    """Whether dynamo compiles ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (``torch._dynamo.config.allow_rnn``)."""
    return bool(getattr(torch._dynamo.config, "allow_rnn", True))


def lazy_graph_module(root: torch.nn.Module, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A ``GraphModule`` of ``graph`` whose Python code is generated only when first needed
    (``torch.fx._lazy_graph_module._LazyGraphModule``, as dynamo makes them), else a plain one.

    The partitioner builds and rewrites graph modules it never calls; generating each one's code
    (``GraphModule.recompile``) was a tenth of a plan search's time.
    """
    try:
        cls = require("torch.fx._lazy_graph_module", "_LazyGraphModule")
    except RuntimeError:
        cls = torch.fx.GraphModule
    return cls(root, graph)


def graph_caches_off_patch() -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd's cache and inductor's FX-graph cache off, local and remote (scoped; restored on
    exit): every compile partitions its joint graph and generates its code anew, under the
    backend's budget and probes, never reusing an entry made under another plan. Inductor's kernel
    cache stays on (``force_disable_caches`` would compile every kernel again in a fresh directory):
    a kernel is keyed by its source, so loading one compiled before changes no plan and no capture.
    Settings this torch does not have are left alone."""
    import importlib

    stack = contextlib.ExitStack()
    for module, keys in (("torch._functorch.config", ("enable_autograd_cache", "enable_remote_autograd_cache")),
                         ("torch._inductor.config", ("fx_graph_cache", "fx_graph_remote_cache"))):
        config = importlib.import_module(module)
        present = {k: False for k in keys if hasattr(config, k)}
        if present:
            stack.enter_context(config.patch(**present))
    return stack


DYNAMO_SETTINGS: tuple[str, ...] = ("nested_graph_breaks", "skip_fwd_side_effects_in_bwd_under_checkpoint")
"""The ``torch._dynamo.config`` flags :func:`with_dynamo_settings` sets to ``True`` for each call."""


def with_dynamo_settings(compiled: Callable[..., _R]) -> Callable[..., _R]:
    """``compiled`` (a ``torch.compile`` result) called under the two dynamo settings every compile
    of ours traces with (scoped to each call with ``torch._dynamo.config.patch``: dynamo reads them
    when it traces a frame, at the first call and at every recompile; a setting this torch lacks
    is left alone, and ``compiled`` itself is returned when it has neither):

    * ``nested_graph_breaks=True``. dynamo does not compile frames of torch's own files on their
      own (``torch.nn`` modules are only inlined into a caller's frame). Without it a graph break
      inside one (``nn.Transformer``'s ``.item()`` in ``_detect_is_causal_mask``) bubbles up to the
      outermost user frame: the whole ``nn.Transformer`` call then runs eagerly, outside every
      compiled graph, unplanned and unseen by a forecast. With it dynamo resumes tracing in the
      nested frame after the break, and the layers on both sides of the break are compiled.
    * ``skip_fwd_side_effects_in_bwd_under_checkpoint=True``. A block under
      ``torch.utils.checkpoint`` whose forward mutates a Python object (transformers' attention
      sets and resets the ``kernels`` package's context variable on every call; a counter) is
      otherwise run eagerly by dynamo, outside every graph: no checkpointing of a Llama layer
      would be a compiled plan. With it the block is compiled and its mutations are made once, in
      the forward, and not made again when the backward recomputes it (eager checkpointing makes
      them twice; for a context variable set and reset, or a cache that must not grow twice, once
      is what the user's code means).
    """
    config = torch._dynamo.config
    settings = {key: True for key in DYNAMO_SETTINGS if hasattr(config, key)}
    if not settings:
        return compiled

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> _R:
        with config.patch(**settings):
            return compiled(*args, **kwargs)

    return call


def breaking_call(fn: Callable[..., _R], *, recompile_limit: int) -> Callable[..., _R]:
    """``fn`` called from a frame dynamo does not trace (``torch.compiler.disable(recursive=False)``):
    a caller being compiled breaks its graph at the call instead of inlining ``fn``, and frames
    ``fn`` calls are compiled as usual. Within the call dynamo's recompile limit (per code object)
    is at least ``recompile_limit``."""
    config = torch._dynamo.config

    @torch.compiler.disable(recursive=False)
    def call(*args: Any, **kwargs: Any) -> _R:
        with config.patch(recompile_limit=max(config.recompile_limit, recompile_limit)):
            return fn(*args, **kwargs)

    return call


def frame_mutations() -> tuple[str, ...] | None:
    """While a backend compiles a frame: the kinds of the Python objects other than tensors that
    the frame mutates and dynamo replays after the graph (``"UserDefinedObjectVariable"`` for an
    object whose attributes it sets, such as a KV cache layer it appends to; ``"ListVariable"``),
    one per object; ``None`` when unknown (no frame being compiled, or dynamo's side-effect record
    is not where torch 2.13 keeps it). Under ``torch.utils.checkpoint`` dynamo cannot keep such
    mutations in the checkpointed graph and runs the call eagerly."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.variables import TensorVariable

        effects = InstructionTranslator.current_tx().output.side_effects
        return tuple(type(v).__name__ for v in effects.id_to_variable.values()
                     if effects.is_modified(v) and not isinstance(v, TensorVariable))
    except Exception:  # noqa: BLE001 - unknown
        return None
