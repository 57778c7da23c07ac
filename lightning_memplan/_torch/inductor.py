"""Inductor: its compile entry points, the partitioner it calls, an observer of its scheduler's
memory estimate, and torch's FX-level memory estimate (a peer of ours).

Each accessor imports its symbol when called and raises the :class:`RuntimeError` of
:func:`~lightning_memplan._torch.version.require` when this torch lacks it. The context managers
(:func:`inductor_partitioner`, :func:`probe_inductor_schedule`) and :func:`torch_fx_peak_estimate`
replace one module attribute of torch each and restore it in ``finally``.
"""
from __future__ import annotations

import contextlib
import importlib
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_memplan._torch.version import require

__all__ = [
    "codegen_only",
    "compile_fx",
    "compile_fx_inner",
    "inductor_partitioner",
    "probe_inductor_schedule",
    "torch_fx_peak_estimate",
]


def compile_fx() -> Callable[..., Any]:
    return require("torch._inductor.compile_fx", "compile_fx")


def compile_fx_inner() -> Callable[..., Any]:
    return require("torch._inductor.compile_fx", "compile_fx_inner")


@contextlib.contextmanager
def codegen_only() -> Iterator[None]:
    """Within the block, inductor lowers, schedules, plans its buffers and writes its wrapper's source
    (so the schedule and wrapper probes see what a real compile does) but builds and loads nothing:
    ``GraphLowering._compile_to_module_lines`` writes the source and returns a module whose ``call``
    raises. The caller runs something else in the compiled graph's place (on fake tensors, the
    graph as it was before inductor's passes). Restored on exit."""
    cls = require("torch._inductor.graph", "GraphLowering")
    code_cache = require("torch._inductor.codecache", "PyCodeCache")
    orig = cls._compile_to_module_lines

    def _compile_to_module_lines(self: Any, wrapper_code: Any) -> Any:
        key, path = code_cache.write(wrapper_code.value)
        mod = types.ModuleType("memplan_codegen_only")
        mod.__file__ = path

        def call(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("lightning_memplan: a codegen-only inductor module is not runnable")

        mod.call = call  # type: ignore[attr-defined]
        self.cache_key, self.cache_path, self.cache_linemap = key, path, []
        return mod

    cls._compile_to_module_lines = _compile_to_module_lines
    try:
        yield
    finally:
        cls._compile_to_module_lines = orig


@contextlib.contextmanager
def inductor_partitioner(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Within the block, inductor's ``compile_fx`` partitions joint graphs with ``wrap(original)``
    (it runs after inductor's joint-graph passes, on the graph the min cut sees); restored on exit."""
    mod = importlib.import_module("torch._inductor.compile_fx")
    original = require("torch._inductor.compile_fx", "min_cut_rematerialization_partition")
    mod.min_cut_rematerialization_partition = wrap(original)
    try:
        yield
    finally:
        mod.min_cut_rematerialization_partition = original


def _origin_names(snode: Any) -> tuple[str, ...]:
    """Names of the FX nodes a scheduler node (fused or not) was lowered from."""
    names: set[str] = set()
    for base in snode.get_nodes():
        for origin in getattr(getattr(base, "node", None), "origins", ()) or ():
            names.add(origin.name)
    return tuple(sorted(names))


@contextlib.contextmanager
def probe_inductor_schedule(
    on_schedule: Callable[[int, list[int], int, bool, float, list[tuple[str, ...]]], None],
) -> Iterator[None]:
    """Observe inductor's scheduler-level memory estimate on the final node order.

    Wraps ``torch._inductor.memory.reorder_for_peak_memory`` (the scheduler imports it from the
    module at call time). After torch reorders, the wrapper runs ``prepare_planning_info`` and
    ``estimate_peak_memory`` on the chosen order and calls
    ``on_schedule(peak_bytes, timeline_bytes, freeable_input_bytes, is_backward, seconds, origins)``
    (``origins[i]``: FX node names scheduler step ``i`` was lowered from); freeable
    inputs are the graph inputs inductor may free (in backward: the saved activations), primals and
    tangents are not counted. The attribute is restored on exit.
    """
    mod = importlib.import_module("torch._inductor.memory")
    orig = require("torch._inductor.memory", "reorder_for_peak_memory")
    prepare = require("torch._inductor.memory", "prepare_planning_info")
    estimate = require("torch._inductor.memory", "estimate_peak_memory")
    virtualized = require("torch._inductor.virtualized", "V")

    def reorder_for_peak_memory(nodes: Any, name_to_buf: Any, name_to_fused_node: Any,
                                graph_inputs: Any, graph_outputs: Any, **kw: Any) -> Any:
        order = orig(nodes, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs, **kw)
        t0 = time.perf_counter()
        is_backward = bool(getattr(virtualized.graph, "is_backward", False))
        try:
            _, freeable = prepare(order, name_to_buf, name_to_fused_node, graph_inputs, graph_outputs)
            peak, timeline = estimate(order, freeable, graph_outputs)
            freeable_bytes = sum(int(b.mpi_buffer.size_free) for b in freeable.values())
            try:
                origins = [_origin_names(n) for n in order]
            except Exception:  # noqa: BLE001 - origins are optional
                origins = []
            on_schedule(int(peak), [int(v) for v in timeline], freeable_bytes, is_backward,
                        time.perf_counter() - t0, origins)
        except Exception:  # noqa: BLE001 - an estimate failure must never break the compile
            on_schedule(-1, [], 0, is_backward, time.perf_counter() - t0, [])
        return order

    mod.reorder_for_peak_memory = reorder_for_peak_memory
    try:
        yield
    finally:
        mod.reorder_for_peak_memory = orig


def memory_estimator_module() -> Any:
    """``torch._inductor.fx_passes.memory_estimator`` (torch's FX-level estimate; a benchmark peer)."""
    require("torch._inductor.fx_passes.memory_estimator", "build_memory_profile")
    return importlib.import_module("torch._inductor.fx_passes.memory_estimator")


def torch_fx_peak_estimate(fw_graph: torch.fx.Graph, bw_graph: torch.fx.Graph) -> int:
    """torch's FX-level estimate of a forward+backward pair, CPU tensors counted (a peer, not ours).

    ``memory_estimator.get_peak_memory`` is broken in torch 2.13 (``get_fwd_bwd_interactions``
    indexes a Node) and ignores CPU; this re-assembles the same algorithm from its working parts.
    Returns the peak minus the bytes live at the forward's start (the primals). The module-global
    ``device_filter`` is replaced for the call and restored.
    """
    me = memory_estimator_module()
    orig = me.device_filter
    me.device_filter = lambda device: True
    try:
        fwd = me.build_memory_profile(fw_graph, me._is_releasable)
        alias = me.GraphAliasTracker(list(fw_graph.nodes))
        primal: set[Any] = set()
        for ph in fw_graph.find_nodes(op="placeholder"):
            if ph.name.startswith("primals"):
                primal |= set(alias.get_fresh_allocations(ph))
        fwd_out = set(alias.get_storage_uses(fw_graph.find_nodes(op="output")[0]))
        bwd_in: set[Any] = set()
        keep: set[str] = set()
        for ph in bw_graph.find_nodes(op="placeholder"):
            st = set(me.GraphAliasTracker._get_output_storages(ph))
            bwd_in |= st
            if st & primal or not (st & fwd_out):
                keep.add(ph.name)
        baseline = sum(int(s.storage.nbytes()) for s in fwd_out - bwd_in)
        bwd = me.build_memory_profile(bw_graph, lambda n: me._is_releasable(n) and n.name not in keep)
    finally:
        me.device_filter = orig
    return int(max(max(fwd), baseline + max(bwd)) - fwd[0])
