"""Memory profile of FX graphs with storage-alias tracking, and the forward→backward coupling.

Pure functions over ``torch.fx`` graphs whose nodes carry ``meta["val"]`` (FakeTensors), such as the
partitioned forward and backward graphs AOTAutograd hands to its compilers. Nothing is executed.

Model (all sizes in bytes, the storage's ``nbytes``):

* A *storage* is identified by the FakeTensor's untyped storage. Views, ``getitem`` of a tuple,
  in-place ops and ``copy_`` into an input produce no new storage; the first node whose output holds a
  storage *allocates* it.
* A storage is freed right after the last node that reads it has run (a multi-output node's storages
  are read by each of its ``getitem`` users), unless it is a graph output or a *baseline* input.
* Graph inputs (placeholders, ``get_attr``) are *baseline* unless named in ``live_inputs``: baseline
  storages were live before the graph ran, are not counted and are never freed (the primals).
  Live inputs are counted from the start and freed after their last use (saved activations and
  tangents entering a backward graph).
* Every device is counted, CPU included (``devices=None``), or only the listed device types.

:class:`MemoryReplay` replays the nodes of one graph in *any* valid order, one node at a time, so a
different schedule (for example a recomputation moved right before its use) can be evaluated without
compiling; :func:`profile_graph` is the replay in graph order, and :func:`profile_region` couples a
forward graph with its backward graph.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from lightning_memplan._torch.storages import concrete_int, storage_key
from lightning_memplan.forecasting.allocations import AllocEvent

__all__ = [
    "GraphStorages",
    "MemoryProfile",
    "MemoryReplay",
    "RegionMemory",
    "profile_graph",
    "profile_region",
]

#: Tag of bytes that belong to no other category.
ACTIVATIONS = "activations"
#: Tag of the backward graph's fresh outputs (parameter and input gradients).
GRADIENTS = "gradients"


def _node_value(node: fx.Node) -> object:
    """``node``'s output value (FakeTensors). A higher-order op that AOTAutograd left without one
    (activation checkpointing's ``run_and_save_rng_state`` / ``run_with_rng_state``, which run an
    op under a saved RNG state) makes the tensors its ``getitem`` users pick out: they are its
    outputs, allocated while its inputs are live, not at the ``getitem``."""
    val = node.meta.get("val")
    if val is not None or node.op != "call_function":
        return val
    picks = [u.meta.get("val") for u in node.users if u.op == "call_function" and u.target is operator.getitem]
    return picks or None


def _tensors(val: object) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    if isinstance(val, dict):
        return [t for v in val.values() for t in _tensors(v)]
    return []


class GraphStorages:
    """Alias analysis of one FX graph: which node allocates which storage and who reads it.

    Attributes (storage keys are opaque ints, stable while the graph's FakeTensors are alive):
        nodes: the graph's nodes in graph order, ``output`` included.
        produced: node name -> keys of every storage its output holds (aliases included).
        fresh: node name -> keys of the storages this node allocates (first producer in graph order).
        readers: key -> names of the nodes that read it (``output`` included when it is returned).
        nbytes: key -> bytes of the storage.
        device: key -> device type (``"cpu"``, ``"cuda"``, ...).
        input_keys: keys allocated by placeholders and ``get_attr`` nodes.
        output_keys: keys held by the graph's outputs.
    """

    def __init__(self, graph: fx.Graph) -> None:
        self.nodes: list[fx.Node] = list(graph.nodes)
        self.produced: dict[str, tuple[int, ...]] = {}
        self.fresh: dict[str, tuple[int, ...]] = {}
        self.readers: dict[int, set[str]] = {}
        self.nbytes: dict[int, int] = {}
        self.device: dict[int, str] = {}
        self.input_keys: set[int] = set()
        self.output_keys: set[int] = set()
        allocator: dict[int, str] = {}
        for node in self.nodes:
            keys: list[int] = []
            for t in _tensors(_node_value(node)):
                key = storage_key(t)
                if key not in keys:
                    keys.append(key)
                if key not in self.nbytes:
                    self.nbytes[key] = concrete_int(t.untyped_storage().nbytes())
                    self.device[key] = t.device.type
            self.produced[node.name] = tuple(keys)
            fresh = tuple(k for k in keys if k not in allocator)
            for k in fresh:
                allocator[k] = node.name
            self.fresh[node.name] = fresh
            if node.op in ("placeholder", "get_attr"):
                self.input_keys.update(fresh)
            for src in node.all_input_nodes:
                for k in self.produced.get(src.name, ()):
                    self.readers.setdefault(k, set()).add(node.name)
            if node.op == "output":
                self.output_keys = {k for src in node.all_input_nodes for k in self.produced[src.name]}
        self.allocator: dict[int, str] = allocator

    def keys_of(self, names: Iterable[str]) -> set[int]:
        """Keys of the storages produced by the named nodes."""
        return {k for n in names for k in self.produced.get(n, ())}


@dataclass(frozen=True, kw_only=True)
class MemoryProfile:
    """Bytes live while one graph runs, in one schedule.

    Invariants: ``len(timeline) == len(order)``; ``peak_bytes == max(start_bytes, *timeline)``.
    Bytes are counted above the baseline (inputs that were live before and are never freed).
    """

    #: Node names in execution order (placeholders and ``output`` excluded).
    order: tuple[str, ...]
    #: Bytes live at each step, right after the node allocated its outputs and before it freed its
    #: inputs (the high-water mark of that step).
    timeline: tuple[int, ...]
    #: Bytes live before the first node ran (counted live inputs).
    start_bytes: int
    #: Bytes live after the last node ran (outputs and unfreed live inputs).
    end_bytes: int
    #: Highest bytes live at any step.
    peak_bytes: int
    #: Node at which the peak occurred (``""`` when the peak is the start).
    peak_node: str
    #: Bytes by tag (``"activations"``, ``"gradients"``, ...) at the peak.
    peak_by_tag: Mapping[str, int] = field(default_factory=dict)
    #: Bytes by tag after the last node.
    end_by_tag: Mapping[str, int] = field(default_factory=dict)
    #: Counted inputs live at the start, as alloc events keyed by storage key.
    inputs: tuple[AllocEvent, ...] = ()
    #: Every allocation and free while the nodes ran, in order (a kernel's workspace is allocated
    #: after the node's outputs and freed before its inputs are), keyed by storage key.
    events: tuple[AllocEvent, ...] = ()


class MemoryReplay:
    """Replays the nodes of one graph one at a time, in any valid order, tracking live bytes.

    ``run(name)`` allocates the node's fresh storages, then frees every releasable storage whose
    readers have all run. A storage is releasable unless it is a graph output or a baseline input.
    ``current_bytes`` is what is live now, ``peak_bytes`` the highest value seen (right after an
    allocation). Running a node before one of its inputs' producers raises ValueError.

    Args:
        storages: the graph's alias analysis.
        live_inputs: names of placeholders whose storages are counted from the start and freed after
            their last reader; all other inputs are baseline (not counted, never freed).
        devices: device types to count (``None``: all, CPU included).
        tags: storage key -> category tag for ``peak_by_tag``; untagged storages are activations.
        workspace: node -> bytes its kernel allocates and frees while it runs (counted at its
            step only, as activations); default none.
    """

    def __init__(
        self,
        storages: GraphStorages,
        *,
        live_inputs: Collection[str] = (),
        devices: Collection[str] | None = None,
        tags: Mapping[int, str] | None = None,
        workspace: Callable[[fx.Node], int] | None = None,
    ) -> None:
        self._s = storages
        self._workspace = workspace
        self._devices = None if devices is None else frozenset(devices)
        self._tags = dict(tags or {})
        live_keys = storages.keys_of(live_inputs) & storages.input_keys
        self._releasable = {
            k for k in storages.nbytes
            if k not in storages.output_keys and (k not in storages.input_keys or k in live_keys)
        }
        self._pending = {k: set(r) for k, r in storages.readers.items()}
        self._done: set[str] = {n.name for n in storages.nodes if n.op in ("placeholder", "get_attr")}
        self._live: set[int] = set()
        self._by_tag: dict[str, int] = {}
        self.current_bytes = 0
        self.events: list[AllocEvent] = []
        for k in sorted(live_keys):
            self._alloc(k)
        self.inputs = tuple(self.events)
        self.events.clear()
        self.start_bytes = self.current_bytes
        self.peak_bytes = self.current_bytes
        self.peak_node = ""
        self.peak_by_tag: dict[str, int] = dict(self._by_tag)
        self.order: list[str] = []
        self.timeline: list[int] = []
        self._node = {n.name: n for n in storages.nodes}
        # live inputs nobody reads are dead on arrival
        for k in list(self._live):
            if k in self._releasable and not self._pending.get(k):
                self._free(k)

    def _counted(self, key: int) -> bool:
        return self._devices is None or self._s.device[key] in self._devices

    def _alloc(self, key: int) -> None:
        if key in self._live or not self._counted(key):
            return
        self._live.add(key)
        size = self._s.nbytes[key]
        self.events.append(AllocEvent("alloc", key, size, self._s.device[key]))
        self.current_bytes += size
        tag = self._tags.get(key, ACTIVATIONS)
        self._by_tag[tag] = self._by_tag.get(tag, 0) + size

    def _free(self, key: int) -> None:
        if key not in self._live:
            return
        self._live.discard(key)
        size = self._s.nbytes[key]
        self.events.append(AllocEvent("free", key, size, self._s.device[key]))
        self.current_bytes -= size
        tag = self._tags.get(key, ACTIVATIONS)
        self._by_tag[tag] -= size

    def run(self, name: str) -> int:
        """Run node ``name``; return the bytes live right after its allocation (before frees)."""
        node = self._node.get(name)
        if node is None:
            raise ValueError(f"`MemoryReplay.run(name={name!r})`: no such node in this graph.")
        if node.op in ("placeholder", "get_attr", "output") or name in self._done:
            raise ValueError(
                f"`MemoryReplay.run(name={name!r})`: node was already run or is not a computation "
                f"(op {node.op!r}); run each call node exactly once."
            )
        missing = [src.name for src in node.all_input_nodes if src.name not in self._done]
        if missing:
            raise ValueError(
                f"`MemoryReplay.run(name={name!r})` before its inputs {missing!r}; "
                "the order must be topological."
            )
        fresh = self._s.fresh[name]
        for k in fresh:
            if k not in self._s.input_keys:
                self._alloc(k)
        extra = self._workspace(node) if self._workspace is not None else 0
        if extra:
            device = node_device(node)
            self.events += [AllocEvent("alloc", ("workspace", name), extra, device),
                            AllocEvent("free", ("workspace", name), extra, device)]
        high = self.current_bytes + extra
        if high > self.peak_bytes:
            self.peak_bytes, self.peak_node, self.peak_by_tag = high, name, dict(self._by_tag)
            if extra:
                self.peak_by_tag[ACTIVATIONS] = self.peak_by_tag.get(ACTIVATIONS, 0) + extra
        self._done.add(name)
        for src in node.all_input_nodes:
            for k in self._s.produced[src.name]:
                pending = self._pending.get(k)
                if pending is not None:
                    pending.discard(name)
                    if not pending and k in self._releasable:
                        self._free(k)
        for k in fresh:  # outputs nobody reads are freed at once
            if k in self._releasable and not self._pending.get(k):
                self._free(k)
        self.order.append(name)
        self.timeline.append(high)
        return high

    def profile(self) -> MemoryProfile:
        """The profile of the nodes run so far."""
        return MemoryProfile(
            order=tuple(self.order),
            timeline=tuple(self.timeline),
            start_bytes=self.start_bytes,
            end_bytes=self.current_bytes,
            peak_bytes=self.peak_bytes,
            peak_node=self.peak_node,
            peak_by_tag=dict(self.peak_by_tag),
            end_by_tag=dict(self._by_tag),
            inputs=self.inputs,
            events=tuple(self.events),
        )


def node_device(node: fx.Node) -> str:
    """Device type of a node's (first) tensor output, or of its first tensor input; else ``"cpu"``."""
    for t in _tensors(_node_value(node)):
        return t.device.type
    for src in node.all_input_nodes:
        for t in _tensors(src.meta.get("val")):
            return t.device.type
    return "cpu"


def _call_nodes(storages: GraphStorages) -> list[str]:
    return [n.name for n in storages.nodes if n.op not in ("placeholder", "get_attr", "output")]


def profile_graph(
    graph: fx.Graph,
    *,
    live_inputs: Collection[str] = (),
    order: Sequence[str] | None = None,
    devices: Collection[str] | None = None,
    tags: Mapping[int, str] | None = None,
    storages: GraphStorages | None = None,
    workspace: Callable[[fx.Node], int] | None = None,
) -> MemoryProfile:
    """Memory profile of ``graph`` run in ``order`` (default: graph order). See :class:`MemoryReplay`."""
    storages = storages or GraphStorages(graph)
    replay = MemoryReplay(storages, live_inputs=live_inputs, devices=devices, tags=tags, workspace=workspace)
    for name in order if order is not None else _call_nodes(storages):
        replay.run(name)
    return replay.profile()


@dataclass(frozen=True, kw_only=True)
class RegionMemory:
    """Memory of one compiled region's forward and backward graphs (bytes above the baseline).

    The forward starts at 0 and ends holding its fresh outputs (``fw_retained_bytes``: user outputs
    plus saved activations). The backward starts holding the saved activations it reads
    (``saved_bytes``) and the tangents (``tangent_bytes``); the rest of the forward's outputs
    (``fw_retained_bytes - saved_bytes``) stays live beside it. Its fresh outputs are gradients.
    """

    fw: MemoryProfile
    bw: MemoryProfile | None
    #: Bytes of fresh forward outputs (saved activations and user outputs) live after the forward.
    fw_retained_bytes: int
    #: Bytes of saved activations the backward reads (freed at their last use in the backward).
    saved_bytes: int
    #: Bytes of the backward's incoming gradients (allocated by autograd before the backward).
    tangent_bytes: int
    #: Bytes of the backward's fresh outputs (gradients), live when it ends.
    gradient_bytes: int
    #: How saved activations were matched: ``"storage"`` (shared FakeTensor storages) or ``"name"``.
    matched_by: str
    #: Bytes of the largest gradient the backward returns in a non-contiguous layout: autograd
    #: copies it into a contiguous tensor (``AccumulateGrad``'s layout contract) after the graph.
    grad_copy_bytes: int = 0
    #: Whether the backward reads one of the forward's activation inputs (an input that is not a
    #: parameter; it then stays live until this backward); ``None`` when unknown.
    saves_activation_inputs: bool | None = None
    #: Whether the backward reads one of the forward's ``other_inputs`` (see :func:`profile_region`);
    #: ``None`` when unknown or none were named.
    saves_other_inputs: bool | None = None
    #: Storage keys of the backward's incoming gradients (among ``bw.inputs``).
    tangent_keys: frozenset[int] = frozenset()
    #: Names of the backward's nodes that read an incoming gradient's storage (views included).
    tangent_readers: frozenset[str] = frozenset()
    #: Names of the backward's nodes that read a saved activation input's storage (views
    #: included): after the last of them the backward holds none of its activation inputs.
    activation_input_readers: frozenset[str] = frozenset()
    #: ``(bytes, reader names)`` of each view of an incoming gradient as large as a tensor (the
    #: stand-in loss's scalar gradient expanded to one output's shape), with the nodes that read
    #: that view other than views of it: where the real gradient of that output is read.
    tangent_views: tuple[tuple[int, frozenset[str]], ...] = ()


def _tangent_views(graph: fx.Graph, storages: GraphStorages, tangent_keys: Collection[int]) -> tuple[
        tuple[int, frozenset[str]], ...]:
    """For each node of ``graph`` that is a view of an incoming gradient (its storage is a
    tangent's) and as large as a tensor of its shape: ``(bytes of that shape, names of its users
    that are not such views)``. A stand-in loss ``sum(o.sum() for o in outputs)`` has one per
    output, expanded from its scalar gradient; the users are where that output's gradient is read."""
    keys = set(tangent_keys)
    views: list[tuple[int, frozenset[str]]] = []
    for node in graph.nodes:
        if node.op == "placeholder" or not keys & set(storages.produced.get(node.name, ())):
            continue
        vals = list(_tensors(_node_value(node)))
        if len(vals) != 1:
            continue
        nbytes = concrete_int(vals[0].numel()) * vals[0].element_size()
        users = frozenset(u.name for u in node.users
                          if u.op != "output" and not keys & set(storages.produced.get(u.name, ())))
        if nbytes and users:
            views.append((nbytes, users))
    return tuple(views)


def profile_region(
    fw_graph: fx.Graph,
    bw_graph: fx.Graph | None,
    *,
    devices: Collection[str] | None = None,
    workspace: Callable[[fx.Node], int] | None = None,
    activation_inputs: Collection[str] | None = None,
    other_inputs: Collection[str] | None = None,
) -> RegionMemory:
    """Profile a partitioned forward graph and its backward graph together.

    Backward placeholders are classified by storage identity with the forward (AOTAutograd shares the
    FakeTensors): a storage the forward allocated is a saved activation (counted, freed at last use);
    a storage of a forward input is a baseline primal; anything else is a tangent (counted) when
    AOTAutograd named it ``tangents_*``, else saved (a checkpoint's RNG state, which the forward
    graph's higher-order op does not show as a tensor it made). When no
    backward placeholder shares a storage with the forward (graphs copied after fake propagation
    re-ran), names decide: ``primals_*`` baseline, ``tangents_*`` tangent, others saved.
    ``workspace`` gives kernel scratch bytes per node (see :class:`MemoryReplay`).
    ``activation_inputs``: names of the forward's placeholders that are activations (not
    parameters), to tell whether the backward keeps one (``saves_activation_inputs``); likewise
    ``other_inputs`` (``saves_other_inputs``).
    """
    fws = GraphStorages(fw_graph)
    fw = profile_graph(fw_graph, devices=devices, storages=fws, workspace=workspace)
    if bw_graph is None:
        return RegionMemory(fw=fw, bw=None, fw_retained_bytes=fw.end_bytes, saved_bytes=0,
                            tangent_bytes=0, gradient_bytes=0, matched_by="storage")
    bws = GraphStorages(bw_graph)
    placeholders = [n for n in bw_graph.nodes if n.op == "placeholder"]
    fw_fresh = {k for name, keys in fws.fresh.items() for k in keys} - fws.input_keys
    shared = any(set(bws.produced[p.name]) & set(fws.nbytes) for p in placeholders)
    saved: list[str] = []
    tangents: list[str] = []
    for p in placeholders:
        keys = set(bws.produced[p.name])
        if shared:
            if keys & fw_fresh:
                saved.append(p.name)
            elif not keys & fws.input_keys:
                # AOTAutograd names the incoming gradients tangents_*; another storage the forward
                # did not make (a checkpoint's saved RNG state, rng_state_output_*) is kept from it
                (tangents if p.name.startswith("tangents") else saved).append(p.name)
        elif p.name.startswith("tangents"):
            tangents.append(p.name)
        elif not p.name.startswith("primals"):
            saved.append(p.name)
    grad_keys = {k for k in bws.output_keys if k not in bws.input_keys}
    tags = {k: GRADIENTS for k in grad_keys}
    bw = profile_graph(bw_graph, live_inputs=saved + tangents, devices=devices, tags=tags, storages=bws,
                       workspace=workspace)

    def _bytes(st: GraphStorages, names: Iterable[str]) -> int:
        keys = st.keys_of(names) & st.input_keys
        return sum(st.nbytes[k] for k in keys if devices is None or st.device[k] in devices)

    def saved_of(names: Collection[str]) -> set[int]:
        keys = fws.keys_of(names) & fws.input_keys
        return {k for p in placeholders if p.name not in tangents for k in set(bws.produced[p.name]) & keys}

    saves_acts: bool | None = None
    saves_others: bool | None = None
    act_readers: frozenset[str] = frozenset()
    if activation_inputs is not None and shared:
        saved_acts = saved_of(activation_inputs)
        saves_acts = bool(saved_acts)
        act_readers = frozenset(n for k in saved_acts for n in bws.readers.get(k, ()) if n != "output")
    if other_inputs and shared:
        saves_others = bool(saved_of(other_inputs))
    tangent_keys = bws.keys_of(tangents) & bws.input_keys
    copies = [
        t.numel() * t.element_size()
        for src in bw_graph.find_nodes(op="output")[0].all_input_nodes
        for t in _tensors(src.meta.get("val"))
        if not t.is_contiguous() and set(bws.produced[src.name]) & grad_keys
    ]
    return RegionMemory(
        grad_copy_bytes=max(copies, default=0),
        fw=fw,
        bw=bw,
        fw_retained_bytes=fw.end_bytes,
        saved_bytes=_bytes(bws, saved),
        tangent_bytes=_bytes(bws, tangents),
        gradient_bytes=sum(bws.nbytes[k] for k in grad_keys if devices is None or bws.device[k] in devices),
        matched_by="storage" if shared else "name",
        tangent_keys=frozenset(tangent_keys),
        tangent_readers=frozenset(n for k in tangent_keys for n in bws.readers.get(k, ()) if n != "output"),
        tangent_views=_tangent_views(bw_graph, bws, tangent_keys),
        saves_activation_inputs=saves_acts,
        saves_other_inputs=saves_others,
        activation_input_readers=act_readers,
    )
