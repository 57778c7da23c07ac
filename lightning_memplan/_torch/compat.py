"""Every private torch symbol lightning_memplan uses, in one place.

torch's partitioner, inductor scheduler and profiler internals change between releases (2.11 on
the GPU machine, 2.13 here). Each accessor below imports one symbol lazily and, when it is missing,
raises a :class:`RuntimeError` that names the symbol, the torch version found and the fix. Nothing
else in the package imports ``torch._*`` modules directly.

The two context managers that temporarily replace a torch module attribute
(:func:`probe_partitioner`, :func:`probe_inductor_schedule`) restore it in ``finally``.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

__all__ = [
    "MIN_TORCH",
    "require",
    "torch_version",
]

#: The oldest torch with ``CustomKnapsackSolver`` (the hook our solver adapter subclasses).
MIN_TORCH: tuple[int, int] = (2, 11)


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed torch, e.g. ``(2, 13)``."""
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def require(module: str, name: str) -> Any:
    """Return ``module.name`` or raise a RuntimeError that says what is missing and how to fix it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(
            f"lightning_memplan needs `{module}.{name}`, which this torch ({torch.__version__!r}) "
            f"does not provide. Supported: torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}; "
            f"upgrade with `pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'`."
        ) from err


def check_torch_version() -> None:
    """Raise a RuntimeError when torch is older than :data:`MIN_TORCH`."""
    if torch_version() < MIN_TORCH:
        raise RuntimeError(
            f"lightning_memplan needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(for CustomKnapsackSolver); found torch {torch.__version__!r}. "
            f"Upgrade with `pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'`."
        )


# --------------------------------------------------------------------------- graph modules
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


# --------------------------------------------------------------------------- partitioner / solver
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


def min_cut_rematerialization_partition() -> Callable[..., Any]:
    return require("torch._functorch.partitioners", "min_cut_rematerialization_partition")


def size_of_node(node: torch.fx.Node) -> int:
    """Bytes the partitioner attributes to ``node`` (``torch._functorch.partitioners._size_of``)."""
    return int(require("torch._functorch.partitioners", "_size_of")(node))


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


def node_inputs_of(node_info: Any) -> list[torch.fx.Node]:
    """``NodeInfo.inputs``: the joint graph's forward inputs (what budget 0 saves)."""
    return list(node_info.inputs)


# --------------------------------------------------------------------------- compile backends
def aot_autograd() -> Callable[..., Any]:
    return require("torch._dynamo.backends.common", "aot_autograd")


def boxed_nop() -> Callable[..., Any]:
    """The no-op boxed compiler of ``aot_eager_decomp_partition`` (frees bw inputs at last use)."""
    return require("torch._dynamo.backends.debugging", "boxed_nop")


def select_decomp_table() -> Any:
    return require("torch._inductor.compile_fx", "select_decomp_table")()


def compile_fx() -> Callable[..., Any]:
    return require("torch._inductor.compile_fx", "compile_fx")


def compile_fx_inner() -> Callable[..., Any]:
    return require("torch._inductor.compile_fx", "compile_fx_inner")


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


def force_disable_caches_patch() -> contextlib.AbstractContextManager[Any]:
    """``torch.compiler.config.patch(force_disable_caches=True)`` (scoped; restored on exit)."""
    cfg = require("torch.compiler", "config")
    return cfg.patch(force_disable_caches=True)


def eager_backward_compile() -> contextlib.AbstractContextManager[Any] | None:
    """A scoped patch that makes AOTAutograd compile each backward graph while compiling its forward
    (``torch._functorch.config.force_non_lazy_backward_lowering``), so the backward is captured
    without running it; ``None`` on a torch without that setting."""
    cfg = functorch_config()
    if not hasattr(cfg, "force_non_lazy_backward_lowering"):
        return None
    return cfg.patch(force_non_lazy_backward_lowering=True)


def flop_registry() -> dict[Any, Callable[..., int]]:
    """``torch.utils.flop_counter.flop_registry``: overload packet -> FLOP formula on shapes."""
    return require("torch.utils.flop_counter", "flop_registry")


# --------------------------------------------------------------------------- inductor scheduler
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


# --------------------------------------------------------------------------- FX estimate (peer)
def memory_estimator_module() -> Any:
    """``torch._inductor.fx_passes.memory_estimator`` (torch's FX-level estimate; a benchmark peer)."""
    require("torch._inductor.fx_passes.memory_estimator", "build_memory_profile")
    return importlib.import_module("torch._inductor.fx_passes.memory_estimator")


# --------------------------------------------------------------------------- profiler
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


def concrete_int(value: Any) -> int:
    """An int from an int or a (hinted) SymInt, without adding guards."""
    if isinstance(value, int):
        return value
    try:
        hint = importlib.import_module("torch.fx.experimental.symbolic_shapes").optimization_hint
        return int(hint(value, fallback=4096))
    except AttributeError:  # older torch: the SymNode carries the hint
        node_hint = getattr(getattr(value, "node", None), "hint", None)
        return int(node_hint) if node_hint is not None else 4096


# --------------------------------------------------------------------------- optimizers
def default_fused_or_foreach(params: list[torch.Tensor]) -> tuple[bool, bool]:
    """``(fused, foreach)`` that torch's optimizers pick by default for these parameters."""
    fn = require("torch.optim.optimizer", "_default_to_fused_or_foreach")
    fused, foreach = fn(params, differentiable=False, use_fused=False)
    return bool(fused), bool(foreach)


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


# --------------------------------------------------------------------------- FSDP2 internals
class Fsdp2Units(NamedTuple):
    """FSDP2 units of a model (see :func:`fsdp2_units`)."""

    #: One :class:`~lightning_memplan.core.fsdp_memory.FsdpUnit` per ``fully_shard`` parameter group.
    units: tuple[Any, ...]
    #: The units' parameter groups (same order): whose forward is running (:func:`fsdp2_active_unit`).
    groups: tuple[Any, ...]
    #: The process-group backend of the all-gathers (``"gloo"``, ``"nccl"``, ...).
    backend: str


def fsdp2_units(model: torch.nn.Module) -> Fsdp2Units | None:
    """The FSDP2 (``fully_shard``) units in ``model`` with their parameters' sizes, read from FSDP's
    parameter groups (``FSDPParam._orig_size``, ``padded_sharded_param_size``; the mesh's shard size;
    ``post_forward_mesh_info`` is None when a unit keeps its parameters after forward, as the root
    does; before the first forward, the root is the outermost unit). ``None`` when there is none,
    or when this torch's internals differ (then nothing is forecast for FSDP)."""
    from lightning_memplan.core.fsdp_memory import FsdpParam, FsdpUnit

    try:
        from torch.distributed.fsdp import FSDPModule

        units, groups, backend = [], [], ""
        outermost = None
        for name, module in model.named_modules():
            if not isinstance(module, FSDPModule):
                continue
            state = module._get_fsdp_state()
            outermost = module if outermost is None else outermost
            # before the first forward (FSDP's lazy init) the root is the outermost unit, and it
            # will keep its parameters after forward unless it was told otherwise
            is_root = state._is_root if state._is_root is not None else module is outermost
            group = state._fsdp_param_group
            if group is None:
                continue
            raf = group.post_forward_mesh_info is not None
            if is_root and state._is_root is None and getattr(state, "_auto_reshard_after_forward", False):
                raf = False
            world = int(group.mesh_info.shard_mesh_size)
            params = []
            for fp in group.fsdp_params:
                size = tuple(fp._orig_size)
                numel = math.prod(size)
                dim0 = size[0] if size else 1
                shard = math.prod(tuple(fp.padded_sharded_param_size))
                param = fp.sharded_param
                # FSDPParam.init_dtype_attrs's rules (it runs at the first forward): the policy's
                # param_dtype for floating-point parameters; reduce_dtype, else the param dtype
                mp = getattr(group, "mp_policy", None)
                compute = getattr(mp, "param_dtype", None) if param.is_floating_point() else None
                reduce = getattr(mp, "reduce_dtype", None)
                params.append(FsdpParam(numel=numel, dim0=dim0, padded_shard_numel=shard,
                                        itemsize=param.element_size(), requires_grad=param.requires_grad,
                                        param_itemsize=compute.itemsize if compute is not None else 0,
                                        reduce_itemsize=reduce.itemsize if reduce is not None else 0))
            units.append(FsdpUnit(name=name or "root", world_size=world, params=tuple(params),
                                  is_root=bool(is_root), reshard_after_forward=raf))
            groups.append(group)
            backend = backend or str(torch.distributed.get_backend(group._all_gather_process_group))
    except Exception:  # noqa: BLE001 - other internals: no FSDP forecast
        return None
    return Fsdp2Units(tuple(units), tuple(groups), backend) if units else None


def fsdp2_active_unit(groups: Sequence[Any]) -> int | None:
    """Index of the innermost unit of ``groups`` (outermost first, as :func:`fsdp2_units` lists
    them) whose forward is running (its group's training state is ``FORWARD``); ``None`` if none."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        active = [i for i, g in enumerate(groups) if g._training_state == TrainingState.FORWARD]
    except Exception:  # noqa: BLE001 - other internals
        return None
    return active[-1] if active else None


def fsdp2_shard_bytes(model: torch.nn.Module) -> dict[int, int]:
    """``{id(parameter): bytes}`` of this rank's padded shard of every FSDP2-managed parameter in
    ``model``, keyed by both the sharded parameter (a DTensor) and, once FSDP made it, the
    unsharded one that replaces it on the module inside a unit's forward: what the parameter and its
    gradient take between steps, whichever of the two the module holds now. Empty without FSDP2 or
    when this torch's internals differ."""
    out: dict[int, int] = {}
    try:
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            for fp in (group.fsdp_params if group is not None else ()):
                nbytes = int(math.prod(tuple(fp.padded_sharded_param_size)) * fp.sharded_param.element_size())
                out[id(fp.sharded_param)] = nbytes
                unsharded = getattr(fp, "_unsharded_param", None)
                if unsharded is not None:
                    out[id(unsharded)] = nbytes
    except Exception:  # noqa: BLE001 - other internals: the caller counts the tensors as they are
        return {}
    return out


class FsdpKinds(NamedTuple):
    """Which FSDP wraps parts of a model (see :func:`fsdp_kinds`)."""

    #: FSDP1's ``FullyShardedDataParallel`` (Lightning's ``FSDPStrategy``).
    fsdp1: bool
    #: FSDP2's ``fully_shard`` units (Lightning's ``ModelParallelStrategy``).
    fsdp2: bool


def fsdp_kinds(model: torch.nn.Module) -> FsdpKinds:
    """Whether FSDP1 and FSDP2 modules are among ``model``'s modules (both False on a torch
    without them)."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:
        return FsdpKinds(False, False)
    mods = list(model.modules())
    return FsdpKinds(fsdp1=any(isinstance(m, FullyShardedDataParallel) for m in mods),
                     fsdp2=any(isinstance(m, FSDPModule) for m in mods))


@contextlib.contextmanager
def fsdp2_backward_hooks_inert(model: torch.nn.Module) -> Iterator[None]:
    """While inside, FSDP2's pre-backward hooks (on every unit's forward outputs) do nothing: no
    all-gather, no prefetch, no final callback queued; each unit's training state is put back on
    exit. For a partial backward that only measures (the loss down to the compiled forward's
    outputs, :func:`~lightning_memplan.forecasting.eager_loss.measure_eager_losses`) in the middle of a step.

    Raises:
        RuntimeError: this torch's FSDP2 internals differ (the measurement is then skipped).
    """
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError as exc:
        raise RuntimeError(f"FSDP2's internals are not where torch {torch.__version__} was expected "
                           f"to keep them ({exc})") from exc
    patched = [(FSDPState, "_register_root_post_backward_final_callback"), (FSDPParamGroup, "pre_backward"),
               (FSDPParamGroup, "_prefetch_unshard")]
    if not all(callable(getattr(cls, name, None)) for cls, name in patched):
        raise RuntimeError(f"FSDP2's pre-backward internals differ in torch {torch.__version__}")
    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
    saved_states = [s._training_state for s in states]
    saved = [(cls, name, cls.__dict__[name]) for cls, name in patched]

    def inert(*args: Any, **kwargs: Any) -> None:
        return None

    try:
        for cls, name, _ in saved:
            setattr(cls, name, inert)
        yield
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)
        for state, training_state in zip(states, saved_states):
            state._training_state = training_state


# --------------------------------------------------------------------------- tensors and pytrees
def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard (FSDP2, tensor parallelism), else ``t``."""
    to_local = getattr(t, "to_local", None)
    if to_local is not None and type(t).__name__ == "DTensor":
        return to_local()
    return t


def storage_key(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (stable while the storage is alive; FakeTensors included)."""
    return int(t.untyped_storage()._cdata)


def storage_weakref(t: torch.Tensor) -> Any:
    """A weak reference to ``t``'s storage (``torch.multiprocessing.reductions.StorageWeakRef``):
    ``.expired()`` once the storage is freed, ``.cdata`` its :func:`storage_key` while it is not."""
    return require("torch.multiprocessing.reductions", "StorageWeakRef")(t.untyped_storage())


def unique_storages(tensors: Sequence[torch.Tensor], seen: set[int]) -> list[tuple[int, str]]:
    """(bytes, device type) of each storage not in ``seen`` (which it extends), in order; of a
    DTensor (FSDP2's sharded parameters, their gradients), this rank's local shard."""
    out: list[tuple[int, str]] = []
    for t in map(local_tensor, tensors):  # a DTensor: this rank's shard
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            out.append((int(t.untyped_storage().nbytes()), t.device.type))
    return out


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    return require("torch.utils._pytree", "tree_map")(fn, tree)


def dynamo_allows_rnn() -> bool:
    """Whether dynamo compiles ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (``torch._dynamo.config.allow_rnn``)."""
    return bool(getattr(torch._dynamo.config, "allow_rnn", True))


def tree_leaves(tree: Any) -> list[Any]:
    return list(require("torch.utils._pytree", "tree_leaves")(tree))


def dispatch_mode_base() -> type:
    """``torch.utils._python_dispatch.TorchDispatchMode``."""
    return require("torch.utils._python_dispatch", "TorchDispatchMode")


def storage_weak_ref(storage: Any) -> Any:
    """A weak reference to an untyped storage with ``expired()``."""
    return require("torch.multiprocessing.reductions", "StorageWeakRef")(storage)


# --------------------------------------------------------------------------- inductor wrapper plan
#: Graph inputs inductor never frees (parameters and user inputs, RNG states, incoming gradients).
NONFREEABLE_PREFIXES = ("primals_", "arg", "fwd_rng_state", "bwd_rng_state", "tangents")
#: Of those, the incoming gradients: inductor's allocator does not count them, but the wrapper
#: deletes them after their last use, and AOTAutograd's boxed call has already dropped its own
#: reference, so their storage is freed there.
TANGENT_PREFIX = "tangents"


class WrapperReplay(NamedTuple):
    """What :func:`_replay_wrapper_lines` found (bytes)."""

    #: Bytes live after each memory-planning line; ``[0]`` before the first, ``[-1]`` on return.
    timeline: list[int]
    #: Bytes of the graph inputs inductor may free (counted from the start), tangents excluded.
    freeable: int
    #: FX origin names of each extern-kernel step (aligned with ``timeline``).
    origins: list[tuple[str, ...]]
    #: ``("alloc" | "free", storage id, bytes, device type)`` in order; the freeable inputs first.
    events: list[tuple[str, int, int, str]]
    #: ``marks[i]``: how many events had happened when ``timeline[i]`` was recorded.
    marks: list[int]
    #: Graph input name -> storage id (inputs of one storage share it).
    inputs: dict[str, int]
    #: Bytes of the incoming gradients (``tangents_*`` inputs), counted from the start like the
    #: freeable inputs and freed at the wrapper's ``del`` (or on return).
    tangents: int = 0


def _replay_wrapper_lines(wrapper: Any) -> WrapperReplay:
    """Replay the memory-planned lines of inductor's Python wrapper: bytes live after each line.

    Allocations (``AllocateLine``, an extern kernel's fresh output, each output of a multi-output
    kernel, counted at the kernel's line, where the kernel allocates it) add their storage bytes;
    ``ReuseLine``/``ReinterpretLine`` give a storage a second name; ``FreeLine``/``FreeIfNotReusedLine``
    (when not reused) drop a name, and a storage is freed when its last name is gone. Graph inputs
    inductor may free (not primals) count from the start, the incoming gradients (tangents) too:
    the wrapper deletes them after their last use and nothing else holds them.
    The last entry is what stays when the graph returns: the storages of its outputs.
    Returns the timeline, the freeable input bytes, the FX origin names of each extern-kernel step,
    and the allocations and frees in order (storages of 0 bytes never reach an allocator: left out).
    """
    w = importlib.import_module("torch._inductor.codegen.wrapper")
    ir = importlib.import_module("torch._inductor.ir")
    graph = require("torch._inductor.virtualized", "V").graph
    # torch 2.13: optimization_hint; older: size_hint
    hint = getattr(graph.sizevars, "optimization_hint", None) or graph.sizevars.size_hint

    def nbytes(buf: Any) -> int:
        layout = buf.get_output_spec() if hasattr(buf, "get_output_spec") else buf.get_layout()
        if not isinstance(layout, ir.Layout):
            return 0
        return int(hint(layout.storage_size(), fallback=4096)) * layout.dtype.itemsize

    def device(buf: Any) -> str:
        dev = buf.get_device() if hasattr(buf, "get_device") else None
        return getattr(dev, "type", None) or "cpu"

    names: dict[str, int] = {}
    sizes: dict[int, int] = {}
    devices: dict[int, str] = {}
    refs: dict[int, set[str]] = {}
    state = {"cur": 0, "next": 0}
    events: list[tuple[str, int, int, str]] = []

    def alloc(name: str, size: int, dev: str) -> None:
        sid = state["next"]
        state["next"] += 1
        names[name], sizes[sid], refs[sid], devices[sid] = sid, size, {name}, dev
        state["cur"] += size
        if size:
            events.append(("alloc", sid, size, dev))

    def alias(new: str, old: str) -> None:
        sid = names.get(old)
        if sid is not None:
            names[new] = sid
            refs[sid].add(new)

    def drop(name: str) -> None:
        for out in unnamed.pop(name, ()):  # outputs the wrapper never took out of the kernel's result
            drop(out)
        sid = names.pop(name, None)
        if sid is not None:
            refs[sid].discard(name)
            if not refs[sid]:
                state["cur"] -= sizes[sid]
                if sizes[sid]:
                    events.append(("free", sid, sizes[sid], devices[sid]))

    # a multi-output kernel (a fallback such as convolution_backward or an attention backward) allocates
    # all its outputs while its inputs are still live; the wrapper only names them later
    # (MultiOutputLine, after the kernel's inputs were deleted), so they are allocated at the kernel.
    outputs_of: dict[str, list[Any]] = {}
    for buf in graph.buffers:
        if isinstance(buf, ir.MultiOutput):
            root = buf.inputs[0]
            while isinstance(root, ir.MultiOutput):
                root = root.inputs[0]
            outputs_of.setdefault(root.get_name(), []).append(buf)
    early: set[str] = set()
    unnamed: dict[str, list[str]] = {}  # kernel name -> early outputs no MultiOutputLine named yet

    # inputs that are views of one storage (the q, k, v slices of one saved qkv buffer) are one
    # allocation, of the storage's size, freed with its last name: grouped by the FX placeholders'
    # FakeTensor storages
    try:
        fakes = {n.target: n.meta.get("val") for n in graph.module.graph.nodes if n.op == "placeholder"}
    except AttributeError:  # no FX module on this lowering: every input counts on its own
        fakes = {}
    first_of: dict[int, str] = {}
    freeable = tangents = 0
    for name, inp in graph.graph_inputs.items():
        if not hasattr(inp, "get_layout"):
            continue
        fake = fakes.get(name)
        is_tangent = name.startswith(TANGENT_PREFIX)
        if name.startswith(NONFREEABLE_PREFIXES) and not is_tangent:
            size = 0
        elif isinstance(fake, torch.Tensor):
            key = storage_key(fake)
            if key in first_of:
                alias(name, first_of[key])
                continue
            first_of[key] = name
            size = concrete_int(fake.untyped_storage().nbytes())
        else:
            size = nbytes(inp)
        if is_tangent:
            tangents += size
        else:
            freeable += size
        alloc(name, size, device(inp))
    input_sids = {name: names[name] for name in graph.graph_inputs if name in names}
    timeline: list[int] = [state["cur"]]
    marks: list[int] = [len(events)]
    origins: list[tuple[str, ...]] = [()]
    for line in wrapper.lines:
        node = getattr(line, "node", None)
        if isinstance(line, w.AllocateLine):
            alloc(node.get_name(), nbytes(node), device(node))
        elif isinstance(line, w.ReuseLine):
            alias(line.reused_as.get_name(), node.get_name())
            if line.delete_old:
                drop(node.get_name())
        elif isinstance(line, w.ReinterpretLine):
            alias(line.reused_as.get_name(), node.get_name())
        elif isinstance(line, w.FreeIfNotReusedLine):
            if not line.is_reused:
                drop(node.get_name())
        elif isinstance(line, w.FreeLine):
            drop(node.get_name())
        elif isinstance(line, w.ExternKernelAllocLine):
            aliased = list(node.get_inputs_that_alias_output())
            if aliased:
                alias(node.get_name(), aliased[0])
            else:
                alloc(node.get_name(), nbytes(node), device(node))
                for out in outputs_of.get(node.get_name(), ()):
                    if nbytes(out):
                        alloc(out.get_name(), nbytes(out), device(out))
                        early.add(out.get_name())
                        unnamed.setdefault(node.get_name(), []).append(out.get_name())
        elif isinstance(line, w.MultiOutputLine):
            if line.result_name in early:
                for outs in unnamed.values():
                    if line.result_name in outs:
                        outs.remove(line.result_name)
            else:
                buf = graph.get_buffer(line.result_name)
                alloc(line.result_name, nbytes(buf), device(buf))
        elif not isinstance(line, w.ExternKernelOutLine):
            continue
        timeline.append(state["cur"])
        marks.append(len(events))
        is_extern = isinstance(line, (w.ExternKernelAllocLine, w.ExternKernelOutLine))
        origins.append(tuple(sorted(o.name for o in (getattr(node, "origins", None) or ()))) if is_extern else ())
    # frees at the very end are dropped from the lines: on return only the outputs' storages stay
    kept = {names[n] for n in graph.get_output_names() if n in names}
    timeline.append(sum(sizes[sid] for sid in kept))
    for sid in sorted({names[n] for n in names} - kept):
        if sizes[sid]:
            events.append(("free", sid, sizes[sid], devices[sid]))
    marks.append(len(events))
    origins.append(())
    return WrapperReplay(timeline, freeable, origins, events, marks, input_sids, tangents)


@contextlib.contextmanager
def probe_inductor_wrapper(
    on_plan: Callable[[WrapperReplay | None, bool, float], None],
) -> Iterator[None]:
    """Observe the allocations inductor's generated wrapper will make, after its buffer reuse.

    Wraps ``PythonWrapperCodegen.memory_plan_reuse``; after it ran, replays the planned lines
    (:func:`_replay_wrapper_lines`) and calls
    ``on_plan(replay, is_backward, seconds)`` (``replay`` is ``None`` when the replay failed). The
    class attribute is restored on exit.
    """
    cls = require("torch._inductor.codegen.wrapper", "PythonWrapperCodegen")
    virtualized = require("torch._inductor.virtualized", "V")
    orig = cls.memory_plan_reuse

    def memory_plan_reuse(self: Any) -> Any:
        result = orig(self)
        t0 = time.perf_counter()
        is_backward = bool(getattr(virtualized.graph, "is_backward", False))
        try:
            replay: WrapperReplay | None = _replay_wrapper_lines(self)
        except Exception:  # noqa: BLE001 - never break the compile
            replay = None
        on_plan(replay, is_backward, time.perf_counter() - t0)
        return result

    cls.memory_plan_reuse = memory_plan_reuse
    try:
        yield
    finally:
        cls.memory_plan_reuse = orig
