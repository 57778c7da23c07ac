"""FSDP internals: FSDP2's (``fully_shard``) units and shard sizes, which unit is running, which
FSDP wraps a model, and FSDP2's pre-backward hooks made inert for a measurement.

The readers return ``None``, ``{}`` or False when there is no FSDP or this torch's internals
differ (then nothing is forecast for FSDP); :func:`fsdp2_backward_hooks_inert` raises a
:class:`RuntimeError` then, and restores the class attributes and training states it changed on exit.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

__all__ = [
    "Fsdp2Units",
    "fsdp2_active_unit",
    "fsdp2_backward_hooks_inert",
    "fsdp2_shard_bytes",
    "fsdp2_units",
    "fsdp_kinds",
]


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
