"""AOTAutograd and its min-cut partitioner: the config, the knapsack-solver hook, the backends'
parts, an observer of the partitioner's decision, and torch's own solvers (the peers of ours).

Each accessor imports its symbol when called and raises the :class:`RuntimeError` of
:func:`~lightning_memplan._torch.version.require` when this torch lacks it
(:func:`custom_knapsack_solver_base` also when torch is older than
:data:`~lightning_memplan._torch.version.MIN_TORCH`). The config patches are scoped (restored on
exit); :func:`probe_partitioner` replaces two module attributes of ``torch._functorch.partitioners``
and restores them in ``finally``.
"""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_memplan._torch.version import check_torch_version, require

__all__ = [
    "aot_autograd",
    "boxed_nop",
    "custom_knapsack_solver_base",
    "eager_backward_compile",
    "flop_registry",
    "functorch_config",
    "min_cut_rematerialization_partition",
    "node_inputs_of",
    "opaque_handles_patch",
    "probe_partitioner",
    "random_ops_saved",
    "select_decomp_table",
    "size_of_node",
    "stand_in_outputs_not_donated",
    "torch_knapsack_solvers",
    "torch_knee_tools",
]


def custom_knapsack_solver_base() -> type:
    """``torch._inductor.custom_graph_pass.CustomKnapsackSolver`` (2.11: plain ABC; 2.13: CustomPassBase)."""
    check_torch_version()
    return require("torch._inductor.custom_graph_pass", "CustomKnapsackSolver")


def functorch_config() -> Any:
    """The ``torch._functorch.config`` module (``activation_memory_budget``, ``..._solver``, ``patch``)."""
    return importlib.import_module("torch._functorch.config")


def opaque_handles_patch() -> dict[str, Any]:
    """``torch._functorch.config`` settings for our compiles beside the budget: script objects in
    a graph (the process group of tensor parallelism's functional collectives) count as zero bytes
    for the partitioner's knapsack; it refuses to size them otherwise and the compile fails. They are
    handles that hold no activation storage. Empty on a torch without the setting."""
    name = "unsafe_treat_script_objects_as_zero_size"
    return {name: True} if hasattr(functorch_config(), name) else {}


def eager_backward_compile() -> contextlib.AbstractContextManager[Any] | None:
    """A scoped patch that makes AOTAutograd compile each backward graph while compiling its forward
    (``torch._functorch.config.force_non_lazy_backward_lowering``), so the backward is captured
    without running it; ``None`` on a torch without that setting."""
    cfg = functorch_config()
    if not hasattr(cfg, "force_non_lazy_backward_lowering"):
        return None
    return cfg.patch(force_non_lazy_backward_lowering=True)


def min_cut_rematerialization_partition() -> Callable[..., Any]:
    return require("torch._functorch.partitioners", "min_cut_rematerialization_partition")


def size_of_node(node: torch.fx.Node) -> int:
    """Bytes the partitioner attributes to ``node`` (``torch._functorch.partitioners._size_of``)."""
    return int(require("torch._functorch.partitioners", "_size_of")(node))


@contextlib.contextmanager
def probe_partitioner(
    on_min_cut: Callable[[Any, tuple[list[torch.fx.Node], Any]], None],
    on_choose: Callable[[float, list[torch.fx.Node]], None],
    min_cut_scope: Callable[[], object | None] | None = None,
) -> Iterator[None]:
    """Observe the partitioner's decision without changing it.

    Wraps ``partitioners.solve_min_cut`` (``on_min_cut(node_info, result)`` after each call) and
    ``partitioners.choose_saved_values_set`` (``on_choose(memory_budget, saved_values)`` after it
    returns). Both are looked up as module globals at call time, so replacing the module attributes
    is enough; they are restored on exit, also on error.

    ``min_cut_scope``: when it returns a key (not None), min-cut results are memoized under
    (key, min-cut options, names of the nodes not to ban) and replayed by node name. Give one key
    per joint graph (copies of one graph share it): the cut depends on the graph and those
    arguments, never on the memory budget, so partitioning one graph under several budgets solves
    each distinct cut once.
    """
    mod = importlib.import_module("torch._functorch.partitioners")
    orig_min_cut = require("torch._functorch.partitioners", "solve_min_cut")
    orig_choose = require("torch._functorch.partitioners", "choose_saved_values_set")
    memo: dict[object, tuple[list[str], list[str], type]] = {}

    def solve_min_cut(joint_graph: Any, node_info: Any, min_cut_options: Any = None, dont_ban: Any = None,
                      *args: Any, **kwargs: Any) -> Any:
        scope = min_cut_scope() if min_cut_scope is not None else None
        key = None
        if scope is not None and not args and not kwargs:
            key = (scope, repr(min_cut_options), tuple(sorted(n.name for n in (dont_ban or ()))))
        hit = memo.get(key) if key is not None else None
        if hit is not None:
            saved_names, banned_names, banned_type = hit
            by_name = {n.name: n for n in joint_graph.nodes}
            if all(n in by_name for n in (*saved_names, *banned_names)):
                result = ([by_name[n] for n in saved_names], banned_type(by_name[n] for n in banned_names))
                on_min_cut(node_info, result)
                return result
        result = orig_min_cut(joint_graph, node_info, min_cut_options, dont_ban, *args, **kwargs)
        if key is not None:
            memo[key] = ([n.name for n in result[0]], [n.name for n in result[1]], type(result[1]))
        on_min_cut(node_info, result)
        return result

    def choose_saved_values_set(joint_graph: Any, node_info: Any, memory_budget: float = 1, **kw: Any) -> Any:
        saved = orig_choose(joint_graph, node_info, memory_budget, **kw)
        on_choose(float(memory_budget), list(saved))
        return saved

    mod.solve_min_cut = solve_min_cut
    mod.choose_saved_values_set = choose_saved_values_set
    try:
        yield
    finally:
        mod.solve_min_cut = orig_min_cut
        mod.choose_saved_values_set = orig_choose


@contextlib.contextmanager
def random_ops_saved() -> Iterator[None]:
    """Within the block, the partitioner never recomputes an op that draws random numbers.

    torch's min-cut bans recomputing its ``random_ops``, but under an activation memory budget
    below 1 its knapsack takes every banned node as a candidate to recompute after all, except
    those tagged ``MUST_SAVE`` (``partitioners.choose_saved_values_set``); and dropout decomposed
    (for inductor, ``aot_eager_decomp_partition``) is ``aten.rand``, not in that list at all. A
    recomputed ``aten.rand`` draws *new* numbers in the backward where random ops are not
    functionalized (the CPU): the backward uses another dropout mask than the forward did, and the
    generator ends one forward's draws further on (the next step's masks change). Here every node
    of the joint graph whose op is tagged ``torch.Tag.nondeterministic_seeded`` and carries no
    recompute tag of its own (``torch.utils.checkpoint`` sets those) is tagged ``MUST_SAVE`` before
    the saved set is chosen. ``partitioners.choose_saved_values_set`` (looked up at call time) is
    replaced for the block and restored on exit."""
    from torch.utils.checkpoint import CheckpointPolicy

    mod = importlib.import_module("torch._functorch.partitioners")
    orig = require("torch._functorch.partitioners", "choose_saved_values_set")
    seeded = torch.Tag.nondeterministic_seeded

    def choose_saved_values_set(joint_graph: Any, node_info: Any, memory_budget: float = 1, **kw: Any) -> Any:
        for node in joint_graph.nodes:
            if (node.op == "call_function" and "recompute" not in node.meta
                    and seeded in getattr(node.target, "tags", ())):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        return orig(joint_graph, node_info, memory_budget, **kw)

    mod.choose_saved_values_set = choose_saved_values_set
    try:
        yield
    finally:
        mod.choose_saved_values_set = orig


@contextlib.contextmanager
def stand_in_outputs_not_donated() -> Iterator[None]:
    """Within the block, AOTAutograd donates to the backward no saved tensor that shares storage
    with an input of ``memplan::materialized_sum`` (the planner's stand-in loss, see
    :mod:`lightning_memplan._torch.materialized`).

    AOTAutograd hands the backward, as buffers it may overwrite, the saved tensors that alias no
    input or output of the forward (``donated_buffer``): inductor then computes a gradient in
    place of, say, the saved logits. In the user's compiled forward the stand-in loss's inputs are
    outputs, never donated, so the backward allocates that gradient anew (a BERT step under
    inductor peaked a logits' size, 2%, above a forecast that reused it). A graph without the
    stand-in loss is left as torch donates it. ``graph_compile.collect_bw_donated_buffer_idxs``
    (looked up at call time) is replaced for the block and restored on exit; a torch without it
    is left alone."""
    try:
        mod = importlib.import_module("torch._functorch._aot_autograd.graph_compile")
        orig = getattr(mod, "collect_bw_donated_buffer_idxs")
        weak_ref = require("torch.multiprocessing.reductions", "StorageWeakRef")
    except (ImportError, AttributeError, RuntimeError):
        yield
        return
    target = getattr(getattr(torch.ops, "memplan", None), "materialized_sum", None)

    def storage(node: Any) -> Any:
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        try:
            return weak_ref(val.untyped_storage()) if isinstance(val, torch.Tensor) else None
        except Exception:  # noqa: BLE001 - a tensor without storage (sparse) is never donated
            return None

    def collect(fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule, fw_metadata: Any) -> list[int]:
        idxs = orig(fw_module, bw_module, fw_metadata)
        sums = [n for n in fw_module.graph.nodes if n.op == "call_function" and target is not None
                and getattr(n.target, "overloadpacket", None) is target]
        if not idxs or not sums:
            return idxs
        stand_in = {storage(a) for n in sums for a in n.all_input_nodes} - {None}
        fw_outs = next(reversed(fw_module.graph.find_nodes(op="output"))).args[0]
        saved = list(fw_outs[fw_metadata.tensors_saved_for_backwards_slice])
        first = fw_metadata.num_symints_saved_for_bw or 0
        return [i for i in idxs if not (0 <= i - first < len(saved) and storage(saved[i - first]) in stand_in)]

    mod.collect_bw_donated_buffer_idxs = collect
    try:
        yield
    finally:
        mod.collect_bw_donated_buffer_idxs = orig


def node_inputs_of(node_info: Any) -> list[torch.fx.Node]:
    """``NodeInfo.inputs``: the joint graph's forward inputs (what budget 0 saves)."""
    return list(node_info.inputs)


def aot_autograd() -> Callable[..., Any]:
    return require("torch._dynamo.backends.common", "aot_autograd")


def boxed_nop() -> Callable[..., Any]:
    """The no-op boxed compiler of ``aot_eager_decomp_partition`` (frees bw inputs at last use)."""
    return require("torch._dynamo.backends.debugging", "boxed_nop")


def select_decomp_table(*, keep_random_ops: bool = False) -> Any:
    """Inductor's decomposition table; with ``keep_random_ops``, without the decompositions of ops
    that draw from a generator (tagged ``nondeterministic_seeded``: ``native_dropout``,
    ``bernoulli``, ``rand_like``, ...), so that compiled eager kernels draw the numbers eager code
    and a plain ``torch.compile(backend="aot_eager")`` draw (the decomposition of dropout into
    ``rand_like(x) < p`` consumes the generator differently)."""
    table = require("torch._inductor.compile_fx", "select_decomp_table")()
    if not keep_random_ops:
        return table
    seeded = torch.Tag.nondeterministic_seeded
    return {op: fn for op, fn in table.items() if seeded not in getattr(op, "tags", ())}


def flop_registry() -> dict[Any, Callable[..., int]]:
    """``torch.utils.flop_counter.flop_registry``: overload packet -> FLOP formula on shapes."""
    return require("torch.utils.flop_counter", "flop_registry")


def torch_knapsack_solvers() -> dict[str, Callable[..., Any]]:
    """torch's own knapsack solvers by our solver names (the peers of :mod:`lightning_memplan.solvers`)."""
    module = "torch._functorch._activation_checkpointing.knapsack"
    return {"greedy": require(module, "greedy_knapsack"), "dp": require(module, "dp_knapsack"),
            "hirschberg": require(module, "dp_knapsack_sliding_hirschberg"), "ilp": require(module, "ilp_knapsack")}


def torch_knee_tools() -> tuple[type, type]:
    """torch's ``(GraphInfoProvider, KnapsackEvaluator)``: the peer of our one-pass knee."""
    base = "torch._functorch._activation_checkpointing."
    return (require(base + "graph_info_provider", "GraphInfoProvider"),
            require(base + "knapsack_evaluator", "KnapsackEvaluator"))
