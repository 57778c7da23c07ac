"""Transitional surface: re-exports, from the concern modules of :mod:`lightning_memplan._torch`,
the names that ``forecasting/step_forecast.py``, ``forecasting/backend.py``, ``planner/step.py``,
``tuner.py`` and ``callback/memplan_callback.py`` still read from here, and nothing else.

New code imports from the concern modules (:mod:`.version`, :mod:`.dynamo`, :mod:`.partitioner`,
:mod:`.inductor`, :mod:`.inductor_wrapper`, :mod:`.fsdp`, :mod:`.storages`); this module goes once
those five import from them too.
"""
from __future__ import annotations

from lightning_memplan._torch.dynamo import (
    dynamo_allows_rnn,
    force_disable_caches_patch,
    isolated_compile_kwargs,
    lazy_graph_module,
    recompile_limit,
)
from lightning_memplan._torch.fsdp import (
    Fsdp2Units,
    fsdp2_active_unit,
    fsdp2_backward_hooks_inert,
    fsdp2_shard_bytes,
    fsdp2_units,
    fsdp_kinds,
)
from lightning_memplan._torch.inductor import (
    compile_fx,
    compile_fx_inner,
    inductor_partitioner,
    probe_inductor_schedule,
    torch_fx_peak_estimate,
)
from lightning_memplan._torch.inductor_wrapper import (
    NONFREEABLE_PREFIXES,
    TANGENT_PREFIX,
    WrapperReplay,
    probe_inductor_wrapper,
)
from lightning_memplan._torch.partitioner import (
    aot_autograd,
    boxed_nop,
    custom_knapsack_solver_base,
    eager_backward_compile,
    functorch_config,
    min_cut_rematerialization_partition,
    node_inputs_of,
    opaque_handles_patch,
    probe_partitioner,
    select_decomp_table,
    size_of_node,
)
from lightning_memplan._torch.storages import (
    local_tensor,
    storage_key,
    storage_weakref,
    tree_leaves,
    tree_map,
    unique_storages,
)
from lightning_memplan._torch.version import check_torch_version

__all__ = [
    # forecasting/backend.py
    "NONFREEABLE_PREFIXES",
    "TANGENT_PREFIX",
    "WrapperReplay",
    "aot_autograd",
    "boxed_nop",
    "check_torch_version",
    "compile_fx",
    "compile_fx_inner",
    "custom_knapsack_solver_base",
    "force_disable_caches_patch",
    "functorch_config",
    "inductor_partitioner",
    "lazy_graph_module",
    "min_cut_rematerialization_partition",
    "node_inputs_of",
    "opaque_handles_patch",
    "probe_inductor_schedule",
    "probe_inductor_wrapper",
    "probe_partitioner",
    "select_decomp_table",
    "size_of_node",
    "storage_key",
    "storage_weakref",
    "tree_leaves",
    # forecasting/step_forecast.py (and above)
    "Fsdp2Units",
    "eager_backward_compile",
    "fsdp2_active_unit",
    "fsdp2_units",
    "isolated_compile_kwargs",
    "torch_fx_peak_estimate",
    "unique_storages",
    # planner/step.py (and above)
    "dynamo_allows_rnn",
    "fsdp2_shard_bytes",
    "local_tensor",
    # tuner.py (and above)
    "fsdp_kinds",
    "tree_map",
    # callback/memplan_callback.py (and above)
    "fsdp2_backward_hooks_inert",
    "recompile_limit",
]
