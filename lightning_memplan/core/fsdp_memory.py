"""The memory FSDP2 (``fully_shard``) allocates and frees around the compiled graphs of one step.

A pure model on plain data (unit sizes, which unit each compiled call ran in); the forecast lays its
events into the step's timeline. Each FSDP unit (a module passed to ``fully_shard``; the root is the
outermost) has, with world size ``N`` and ``c_p = ceil(d0 / N) * numel_p / d0`` the padded shard of
parameter ``p`` (every rank pads its shard to the first one's size):

* ``S = sum_p c_p * itemsize``: the shard bytes, of the sharded parameters and of the reduce-scatter
  output that becomes the sharded gradients;
* ``U = N * S``: the all-gather output, the unsharded parameters (one padded storage per parameter)
  and the reduce-scatter input;
* ``P = sum_p numel_p * itemsize`` over parameters that require grad: autograd's unsharded gradients.

One step (torch 2.13's ``_fsdp_param_group``; checked event by event, byte for byte, against the
profiler on 2 and 3 gloo processes):

* root pre-forward: all-gather output ``+U(r)``, unsharded parameters ``+U(r)``; the root keeps its
  parameters unsharded until the end of the backward (``reshard_after_forward`` is False for it).
* each unit's pre-forward: ``+U`` all-gather output, ``+U`` unsharded parameters, then the previous
  all-gather output is freed (the forward keeps one until the next copy-out); its post-forward frees
  the unsharded parameters (``reshard_after_forward``); the root's post-forward frees the last
  all-gather output.
* backward, units in reverse: the root's pre-backward prefetches the last unit's all-gather; each
  unit's pre-backward copies out its parameters (``+U``), frees its all-gather output and prefetches
  the next unit's (``+U``); its post-backward frees the parameters, frees the reduce-scatter input
  held from the previous unit, allocates its own (``+U``), frees autograd's gradients (``-P``) and
  allocates the sharded gradients (``+S``, live until ``zero_grad``). The first unit's post-backward
  waits for the final callback when its input needs no gradient; the callback runs the root's, then
  that one, then frees the last reduce-scatter input.
* a unit that does not reshard after forward keeps its parameters and all-gathers nothing in the
  backward.

Collective temporaries depend on the backend (:class:`Collectives`): gloo copies ``U`` once per
all-gather and reduce-scatter (transient); on CPU the reduce-scatter pads every gradient whose first
dimension ``N`` does not divide (all live at once, transient). NCCL writes in place.

Mixed precision (``MixedPrecisionPolicy``): the all-gather output, the unsharded parameters and
autograd's gradients are in ``param_dtype`` (the shard is first cast into a flat copy-in buffer,
transient); the reduce-scatter input and output in ``reduce_dtype`` (default: ``param_dtype``), the
output cast to the sharded gradients' dtype when it differs.

Not modelled: CPU offload, HSDP, explicit prefetching, gloo releasing a copy late.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Collectives", "FsdpParam", "FsdpUnit", "Point", "fsdp_step_events"]

#: Where events go in the step: ``("fw" | "bw", position, "before" | "after")`` of the compiled call at
#: ``position`` (in the order one step runs them).
Point = tuple[str, int, str]


@dataclass(frozen=True, kw_only=True)
class FsdpParam:
    """One sharded parameter: its full ``numel`` and first dimension, and the padded numel of one
    rank's shard (``ceil(dim0 / world) * numel / dim0``)."""

    numel: int
    dim0: int
    padded_shard_numel: int
    #: Bytes per element of the parameter (its shards and sharded gradients).
    itemsize: int
    requires_grad: bool = True
    #: Bytes per element it is all-gathered and computed in (``MixedPrecisionPolicy.param_dtype``:
    #: the unsharded parameter and autograd's gradient); 0: ``itemsize``.
    param_itemsize: int = 0
    #: Bytes per element of its reduce-scatter (``reduce_dtype``); 0: ``param_itemsize``.
    reduce_itemsize: int = 0

    @property
    def compute_itemsize(self) -> int:
        return self.param_itemsize or self.itemsize

    @property
    def reduce_size(self) -> int:
        return self.reduce_itemsize or self.compute_itemsize


@dataclass(frozen=True, kw_only=True)
class FsdpUnit:
    """One FSDP unit (``fully_shard``'s parameter group). Sizes in bytes."""

    name: str
    world_size: int
    params: tuple[FsdpParam, ...]
    is_root: bool = False
    reshard_after_forward: bool = True

    @property
    def shard_bytes(self) -> int:
        """``S``: one rank's padded shard, and the sharded gradients."""
        return sum(p.padded_shard_numel * p.itemsize for p in self.params)

    @property
    def unsharded_bytes(self) -> int:
        """``U``: the all-gather output and the unsharded parameters (in the compute dtype)."""
        return self.world_size * sum(p.padded_shard_numel * p.compute_itemsize for p in self.params)

    @property
    def copy_in_bytes(self) -> int:
        """The all-gather's input cast to the compute dtype, when that differs (transient)."""
        return sum(p.padded_shard_numel * p.compute_itemsize for p in self.params if p.param_itemsize)

    @property
    def reduce_scatter_bytes(self) -> int:
        """The reduce-scatter input (in the reduce dtype)."""
        return self.world_size * sum(p.padded_shard_numel * p.reduce_size for p in self.params)

    @property
    def reduce_output_bytes(self) -> int:
        """The reduce-scatter output when its dtype differs from the parameters' (cast to the
        sharded gradients, then freed); 0 otherwise."""
        return sum(p.padded_shard_numel * p.reduce_size for p in self.params if p.reduce_size != p.itemsize)

    @property
    def grad_bytes(self) -> int:
        """``P``: autograd's unsharded gradients (unpadded, in the compute dtype)."""
        return sum(p.numel * p.compute_itemsize for p in self.params if p.requires_grad)

    @property
    def pad_copy_bytes(self) -> int:
        """Padded copies the CPU reduce-scatter makes of gradients whose first dimension the world
        size does not divide (all live at once)."""
        return sum(self.world_size * p.padded_shard_numel * p.compute_itemsize for p in self.params
                   if p.requires_grad and p.dim0 % self.world_size)


@dataclass(frozen=True, kw_only=True)
class Collectives:
    """What the collectives allocate besides FSDP's buffers."""

    #: gloo: one transient copy of ``U`` per all-gather and reduce-scatter (NCCL: none).
    copies: bool = False
    #: CPU: padded copies of the gradients the reduce-scatter packs (see ``FsdpUnit.pad_copy_bytes``).
    pad_copies: bool = False


#: One event: ``(name, category, bytes)``; ``bytes`` > 0 allocates, < 0 frees. ``category`` is
#: ``"fsdp"`` (FSDP's buffers) or ``"gradients"`` (autograd's unsharded gradients freed, the sharded
#: ones made: ``zero_grad`` frees those with the others).
Event = tuple[str, str, int]


def fsdp_step_events(
    units: Sequence[FsdpUnit],
    owners: Sequence[int | None],
    collectives: Collectives = Collectives(),
) -> dict[Point, list[Event]]:
    """FSDP's allocations and frees of one training step, by where they happen (see the module
    docstring).

    ``owners[j]``: the index into ``units`` of the innermost unit whose forward ran the compiled
    call at position ``j`` (``None``: no unit). Units no call belongs to (no compiled code ran in
    them) are left out, except the root (``is_root``), whose forward holds the others': when its
    own layers ran uncompiled (dynamo does not compile ``torch.nn``'s frames, e.g. a ``Linear``
    head), their unsharded gradients are counted from the start of the backward. The first
    unit's post-backward waits for the final callback when it owns the step's first call (its
    input is the batch, which needs no gradient). Bytes are per rank.
    """
    n = len(owners)
    if n == 0:
        return {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, u in enumerate(owners):
        if u is not None:
            first.setdefault(u, j)
            last[u] = j
    root = next((i for i, u in enumerate(units) if u.is_root), None)
    blocks = sorted((i for i in first if i != root), key=first.__getitem__)
    if root is None and not blocks:
        return {}
    # the root's forward holds every unit's: it ends after the last call any unit ran
    end_fw = max(last.values(), default=n - 1)
    out: dict[Point, list[Event]] = {}

    def add(point: Point, name: str, nbytes: int, category: str = "fsdp") -> None:
        if nbytes:
            out.setdefault(point, []).append((name, category, nbytes))

    def all_gather(point: Point, u: FsdpUnit) -> None:
        add(point, f"fsdp all-gather input {u.name}", u.copy_in_bytes)
        add(point, f"fsdp all-gather {u.name}", u.unsharded_bytes)
        if collectives.copies:  # the backend's own copy, transient
            add(point, f"fsdp all-gather copy {u.name}", u.unsharded_bytes)
            add(point, f"fsdp all-gather copy {u.name} freed", -u.unsharded_bytes)
        add(point, f"fsdp all-gather input {u.name} freed", -u.copy_in_bytes)

    held: FsdpUnit | None = None  # whose reduce-scatter input is kept until the next post-backward

    def free_held(point: Point) -> None:
        nonlocal held
        if held is not None:
            add(point, f"fsdp reduce-scatter input {held.name} freed", -held.reduce_scatter_bytes)
            held = None

    def post_backward(point: Point, i: int) -> None:
        nonlocal held
        u = units[i]
        add(point, f"fsdp reshard {u.name}", -u.unsharded_bytes)
        free_held(point)
        add(point, f"fsdp reduce-scatter input {u.name}", u.reduce_scatter_bytes)
        if collectives.pad_copies and u.pad_copy_bytes:
            add(point, f"fsdp reduce-scatter padding {u.name}", u.pad_copy_bytes)
            add(point, f"fsdp reduce-scatter padding {u.name} freed", -u.pad_copy_bytes)
        add(point, f"fsdp unsharded gradients {u.name} freed", -u.grad_bytes, "gradients")
        # the reduce-scatter output: the sharded gradients, or, reduced in another dtype, a buffer
        # cast to them after the collective
        if u.reduce_output_bytes:
            add(point, f"fsdp reduce-scatter output {u.name}", u.reduce_output_bytes)
        else:
            add(point, f"fsdp sharded gradients {u.name}", u.shard_bytes, "gradients")
        if collectives.copies:
            add(point, f"fsdp reduce-scatter copy {u.name}", u.reduce_scatter_bytes)
            add(point, f"fsdp reduce-scatter copy {u.name} freed", -u.reduce_scatter_bytes)
        if u.reduce_output_bytes:
            add(point, f"fsdp sharded gradients {u.name}", u.shard_bytes, "gradients")
            add(point, f"fsdp reduce-scatter output {u.name} freed", -u.reduce_output_bytes)
        held = u

    # forward
    gathered: FsdpUnit | None = None  # whose all-gather output is kept until the next copy-out
    if root is not None:
        gathered = units[root]
        all_gather(("fw", 0, "before"), gathered)
        add(("fw", 0, "before"), f"fsdp unsharded parameters {gathered.name}", gathered.unsharded_bytes)
    for i in blocks:
        u, point = units[i], ("fw", first[i], "before")
        all_gather(point, u)
        add(point, f"fsdp unsharded parameters {u.name}", u.unsharded_bytes)
        if gathered is not None:
            add(point, f"fsdp all-gather {gathered.name} freed", -gathered.unsharded_bytes)
        gathered = u
        if u.reshard_after_forward:
            add(("fw", last[i], "after"), f"fsdp reshard {u.name}", -u.unsharded_bytes)
    if gathered is not None:  # the root's post-forward
        add(("fw", end_fw, "after"), f"fsdp all-gather {gathered.name} freed", -gathered.unsharded_bytes)
    # backward: units in reverse; a unit that kept its parameters all-gathers nothing
    prefetched: set[int] = set()
    order = blocks[::-1]
    if order and units[order[0]].reshard_after_forward:  # the root's pre-backward prefetches the last unit
        all_gather(("bw", end_fw, "before"), units[order[0]])
        prefetched.add(order[0])
    if root is not None and root not in first:  # the root's own layers ran uncompiled: their gradients
        add(("bw", end_fw, "before"), f"fsdp unsharded gradients {units[root].name} (uncompiled)",
            units[root].grad_bytes, "gradients")
    deferred = blocks[0] if blocks and first[blocks[0]] == 0 else None
    for k, i in enumerate(order):
        u, point = units[i], ("bw", last[i], "before")
        if u.reshard_after_forward:
            if i not in prefetched:
                all_gather(point, u)
            add(point, f"fsdp unsharded parameters {u.name}", u.unsharded_bytes)
            add(point, f"fsdp all-gather {u.name} freed", -u.unsharded_bytes)
            nxt = order[k + 1] if k + 1 < len(order) else None
            if nxt is not None and units[nxt].reshard_after_forward:
                all_gather(point, units[nxt])
                prefetched.add(nxt)
        if i != deferred:
            post_backward(("bw", first[i], "after"), i)
    end = ("bw", 0, "after")  # the final callback: the root, then a deferred first unit
    for i in (root, deferred):
        if i is not None:
            post_backward(end, i)
    free_held(end)
    return out
