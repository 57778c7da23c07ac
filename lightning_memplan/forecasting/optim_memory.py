"""Memory of an optimizer: its state, and the temporaries of one ``step()``, predicted on meta tensors.

The optimizer is never stepped. A clone of the same class and hyperparameters is built over ``meta``
copies of its parameters (same shapes and dtypes, no data), its state is created by one warm-up step
when the real optimizer has none yet, and the steady-state ``step()`` plus
``zero_grad(set_to_none=True)`` is replayed under a dispatch mode that tracks every storage an op
creates until it dies. Choices that depend on the device (the ``foreach`` implementation) are
resolved from the real parameters first, so the clone takes the same code path.

All sizes are bytes; CPU scalar tensors (Adam's ``step``) are counted like any other tensor.
"""
from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from lightning_memplan._torch.optim import default_fused_or_foreach
from lightning_memplan._torch.storages import (
    dispatch_mode_base,
    local_tensor,
    storage_key,
    storage_weak_ref,
    tree_leaves,
)
from lightning_memplan.forecasting.allocations import AllocEvent

__all__ = ["OptimizerMemory", "optimizer_memory"]


@dataclass(frozen=True, kw_only=True)
class OptimizerMemory:
    """Predicted memory of one optimizer (bytes)."""

    #: Bytes of the optimizer state in steady state (after its first step), unique storages.
    state_bytes: int
    #: Peak bytes of temporaries during one steady-state ``step()``, above params, grads and state.
    step_peak_bytes: int
    #: ``"existing"`` (the optimizer has state: read from it) or ``"simulated"`` (created on meta tensors).
    state_source: str
    #: Why the step could not be simulated (then ``step_peak_bytes`` is 0); ``""`` when it was.
    problem: str = ""
    #: The state's storages (bytes, device type), unique, in parameter order.
    state_storages: tuple[tuple[int, str], ...] = ()
    #: The temporaries of one steady-state ``step()`` plus ``zero_grad``, allocated and freed in
    #: order (keys local to this trace); their running sum peaks at ``step_peak_bytes``.
    step_events: tuple[AllocEvent, ...] = ()


@functools.lru_cache(maxsize=None)
def _tracker_class() -> type:
    base = dispatch_mode_base()

    class _AllocTracker(base):  # type: ignore[misc, valid-type]
        """Counts bytes of storages created by ops inside it, until each storage dies."""

        def __init__(self) -> None:
            super().__init__()
            self._live: dict[int, tuple[Any, int, str]] = {}
            self.current = 0
            self.peak = 0
            self.events: list[AllocEvent] = []

        def _sweep(self) -> None:
            for key in [k for k, (ref, _, _) in self._live.items() if ref.expired()]:
                _, nbytes, device = self._live.pop(key)
                self.current -= nbytes
                self.events.append(AllocEvent("free", key, nbytes, device))

        def __exit__(self, *exc: object) -> Any:
            self._sweep()
            return super().__exit__(*exc)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self._sweep()
            seen = {storage_key(t) for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)}
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                key = storage_key(t)
                if key in seen or key in self._live:
                    continue
                st = t.untyped_storage()
                nbytes = int(st.nbytes())
                self._live[key] = (storage_weak_ref(st), nbytes, t.device.type)
                self.current += nbytes
                self.events.append(AllocEvent("alloc", key, nbytes, t.device.type))
            self.peak = max(self.peak, self.current)
            return out

    return _AllocTracker


def _unique_storages(tensors: list[torch.Tensor], meta_device: str) -> tuple[tuple[int, str], ...]:
    """(bytes, device type) of each distinct storage, in first-seen order; ``meta`` read as
    ``meta_device``; of a DTensor, this rank's local shard."""
    seen: dict[int, tuple[int, str]] = {}
    for t in map(local_tensor, tensors):
        dev = meta_device if t.device.type == "meta" else t.device.type
        seen.setdefault(storage_key(t), (int(t.untyped_storage().nbytes()), dev))
    return tuple(seen.values())


def _state_tensors(state: Any) -> list[torch.Tensor]:
    return [t for s in state.values() for t in tree_leaves(s) if isinstance(t, torch.Tensor)]


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    t = local_tensor(t)  # a DTensor's state: this rank's shard
    # CPU scalars (Adam's non-capturable `step`) stay real: the step reads them with .item()
    if t.device.type == "cpu" and t.dim() == 0:
        return t.detach().clone()
    return torch.empty_like(t, device="meta")


def optimizer_memory(optimizer: torch.optim.Optimizer, *, gradless: Collection[int] = ()) -> OptimizerMemory:
    """Predict the optimizer's steady-state state bytes and the temporaries of one step.

    ``gradless``: ``id``s of parameters the training step gives no gradient (nothing reads them):
    torch's optimizers skip them, so they get no state and no temporaries (their existing state,
    if any, still counts).

    Never raises for an optimizer it cannot simulate: ``problem`` says why, and the step peak is 0.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    existing = _state_tensors(optimizer.state)
    has_state = len(optimizer.state) > 0
    try:
        fused, foreach = default_fused_or_foreach(params)
        # sharded parameters (DTensors) are stepped shard by shard: simulate this rank's shards
        meta = {id(p): torch.nn.Parameter(torch.empty_like(local_tensor(p), device="meta"),
                                          requires_grad=p.requires_grad)
                for p in params}
        groups = []
        for g in optimizer.param_groups:
            opts = {k: v for k, v in g.items() if k != "params"}
            if "foreach" in opts and opts["foreach"] is None and not opts.get("fused"):
                opts["foreach"] = foreach and not fused
            groups.append({**opts, "params": [meta[id(p)] for p in g["params"]]})
        clone = type(optimizer)(groups)
        for p in params:
            if p.requires_grad and id(p) not in gradless:
                meta[id(p)].grad = torch.empty_like(meta[id(p)])
        if has_state:
            for p, s in optimizer.state.items():
                clone.state[meta[id(p)]] = {k: _to_meta(v) if isinstance(v, torch.Tensor) else v
                                            for k, v in s.items()}
        else:
            clone.step()  # creates the state, as the first real step will
        device = params[0].device.type if params else "cpu"
        storages = _unique_storages(existing if has_state else _state_tensors(clone.state), device)
        with _tracker_class()() as tracker:
            clone.step()
            clone.zero_grad(set_to_none=True)
        events = tuple(e._replace(device=device) if e.device == "meta" else e for e in tracker.events)
        return OptimizerMemory(state_bytes=sum(n for n, _ in storages), step_peak_bytes=tracker.peak,
                               state_source="existing" if has_state else "simulated",
                               state_storages=storages, step_events=events)
    except Exception as err:  # noqa: BLE001 - any optimizer: report, never fail the forecast
        storages = _unique_storages(existing, params[0].device.type if params else "cpu")
        return OptimizerMemory(
            state_bytes=sum(n for n, _ in storages), step_peak_bytes=0, state_storages=storages,
            state_source="existing",
            problem=f"could not simulate {type(optimizer).__name__}.step() on meta tensors: "
                    f"{type(err).__name__}: {err}",
        )
