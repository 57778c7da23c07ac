"""Inductor's generated Python wrapper, replayed: the bytes its memory-planned lines allocate and
free, after inductor's buffer reuse.

:func:`probe_inductor_wrapper` wraps ``PythonWrapperCodegen.memory_plan_reuse`` for the duration of
a block (the class attribute is restored in ``finally``) and hands each graph's
:class:`WrapperReplay` (bytes; ``None`` when the replay failed, which never breaks the compile) to
its callback. Raises the :class:`RuntimeError` of :func:`~lightning_memplan._torch.version.require`
when this torch lacks the wrapper codegen.
"""
from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from lightning_memplan._torch.storages import concrete_int, storage_key
from lightning_memplan._torch.version import require

__all__ = [
    "NONFREEABLE_PREFIXES",
    "TANGENT_PREFIX",
    "WrapperReplay",
    "probe_inductor_wrapper",
]


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
