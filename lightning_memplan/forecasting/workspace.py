"""Kernel workspaces: bytes an op allocates inside its kernel and frees before it returns.

FX graphs show each op's outputs, not the scratch memory its kernel uses (CPU convolution backward
allocates im2col columns as large as an activation; the low-memory max-pool prims run eager
decompositions with temporaries). :func:`probe_workspace` runs such an op once on zero tensors with
the node's shapes, strides, dtypes and device, and reports the measured peak minus the bytes of its
outputs. Results are cached per signature.

Which ops are probed: with ``every_op=False`` (inductor, which generates code for everything else)
the attention kernels of :data:`PROBED_OPS`, and on CUDA its convolutions too (cuDNN's workspace
comes from the caching allocator: 10 MB for a 32x32x32x32 convolution backward on an H200). On CPU
inductor re-lays out convolutions (channels-last, mkldnn), so probing them with the graph's strides
would count scratch it does not use;
with ``every_op=True`` (eager kernels) every op except views, the cheap ops of
:data:`NO_WORKSPACE_OPS` and pointwise ops, but for pointwise ops on CPU whose inputs are of mixed
dtypes (TensorIterator copies them into temporaries of the common dtype) and for matrix products
with an operand BLAS cannot read in place (:func:`_blas_copies`). An op that activation
checkpointing runs under a saved RNG state is probed as itself.

On fake tensors (a forecast that runs nothing, :func:`estimating_workspaces`), nothing is probed on
the target: the ops whose workspace follows from their arguments are computed (TensorIterator's
dtype copies, BLAS's layout copies, the masked index-put of an embedding's backward); on a CPU
target any other probed op runs on the host when its operands are small (at most
``host_probe_limit`` bytes); every other one is counted in :attr:`WorkspaceEstimate.unknown` (0
bytes in the forecast, named in its problems).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from lightning_memplan._torch.fake import is_fake, real_tensors
from lightning_memplan._torch.storages import (
    concrete_int,
    storage_key,
    tree_leaves,
    tree_map,
)
from lightning_memplan.measure import PeakWindow

__all__ = ["LOW_PRECISION_CPU_MATMULS", "PROBED_OPS", "WorkspaceEstimate", "estimating_workspaces", "probe_workspace"]

#: Names of the aten overload packets whose kernels are probed.
PROBED_OPS: frozenset[str] = frozenset({
    "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
})


#: Matrix products probed on CPU in bfloat16 and float16, by inductor too (an extern kernel there).
#: oneDNN's bf16 GEMM allocates scratch beside its output, by an amount that depends on the CPU's
#: instruction set: a 16x32 @ 32x64 ``addmm`` took 18,048 B on an AMD EPYC with avx512_bf16 and
#: 4,224 B with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` (28% of a small bf16 training step); float16
#: took none there. Probing on the machine that trains measures its own.
LOW_PRECISION_CPU_MATMULS: frozenset[str] = frozenset({"mm", "addmm", "bmm", "baddbmm"})


#: Ops whose kernels are known not to allocate scratch memory worth probing (in float32; see
#: :data:`LOW_PRECISION_CPU_MATMULS`).
NO_WORKSPACE_OPS: frozenset[str] = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
    "clone", "copy_", "_to_copy", "empty", "empty_like", "empty_strided", "zeros", "ones", "full",
    "full_like", "zeros_like", "ones_like", "scalar_tensor", "cat", "stack", "index_select", "gather",
    "scatter", "scatter_add", "embedding", "embedding_dense_backward", "index_put", "_unsafe_index_put",
    "native_layer_norm", "native_layer_norm_backward", "var_mean", "rsqrt", "where",
})


@dataclass
class WorkspaceEstimate:
    """How the workspaces of a forecast on fake tensors were found (:func:`estimating_workspaces`)."""

    #: The device type the step is forecast for (``"cpu"`` or ``"cuda"``): which kernels run.
    device: str
    #: Largest total of an op's operand bytes probed on the host (CPU targets only).
    host_probe_limit: int
    #: Op name -> nodes whose workspace is unknown (counted as 0 bytes).
    unknown: Counter[str] = field(default_factory=Counter)
    #: Op name -> nodes probed on the host.
    host_probed: Counter[str] = field(default_factory=Counter)


_ESTIMATE: contextvars.ContextVar[WorkspaceEstimate | None] = contextvars.ContextVar("memplan_workspace_estimate",
                                                                                    default=None)


@contextlib.contextmanager
def estimating_workspaces(device: str, *, host_probe_limit: int = 64 * 2**20) -> Iterator[WorkspaceEstimate]:
    """Within the block, :func:`probe_workspace` on fake tensors finds each workspace without running
    on the target (see the module doc) as ``device`` runs it, and records what it could not."""
    est = WorkspaceEstimate(device=device, host_probe_limit=host_probe_limit)
    token = _ESTIMATE.set(est)
    try:
        yield est
    finally:
        _ESTIMATE.reset(token)


def _nbytes(t: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    return concrete_int(t.numel()) * (dtype or t.dtype).itemsize


def _computed_workspace(name: str, args: Any, kwargs: Any, mixed: bool, copies: bool,
                        out: torch.Tensor | None) -> int | None:
    """Workspace bytes of an op whose scratch follows from its arguments; ``None`` for other ops.

    - a pointwise op on CPU with inputs of mixed dtypes (:func:`_mixed_dtypes`): each input not of
      the common dtype copied into it (0-dim inputs are read as scalars);
    - a matrix product with an operand BLAS cannot read in place (:func:`_blas_copies`): that
      operand made contiguous;
    - ``_unsafe_masked_index_put_accumulate(x, mask, indices, values)`` (an embedding's backward):
      the clamped indices and the masked values live while the accumulated output is made; the
      negated mask, before it, while the masked values are made.
    """
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if mixed:
        common = out.dtype if out is not None and out.dtype != torch.bool else functools.reduce(
            torch.promote_types, [t.dtype for t in tensors])
        return sum(_nbytes(t, common) for t in tensors if t.dim() > 0 and t.dtype != common)
    if copies:
        return sum(_nbytes(t) for t in tensors if not _blas_layout(t))
    if name == "_unsafe_masked_index_put_accumulate" and len(args) >= 4:
        x, mask, indices, values = args[:4]
        index_bytes = sum(_nbytes(i) for i in indices if isinstance(i, torch.Tensor))
        masked = concrete_int(torch.broadcast_shapes(values.shape, mask.shape).numel()) * values.dtype.itemsize
        return index_bytes + masked + max(_nbytes(mask) - _nbytes(x), 0)
    return None


def _estimated(target: Any, args: Any, kwargs: Any, est: WorkspaceEstimate, mixed: bool, copies: bool,
               out: torch.Tensor | None) -> int:
    name = getattr(getattr(target, "overloadpacket", None), "__name__", str(target))
    computed = _computed_workspace(name, args, kwargs, mixed, copies, out)
    if computed is not None:
        return computed
    if est.device == "cpu" and sum(_nbytes(t) for t in tree_leaves((args, kwargs))
                                   if isinstance(t, torch.Tensor)) <= est.host_probe_limit:
        est.host_probed[name] += 1
        with real_tensors():
            return _run_probe(target, args, kwargs)
    est.unknown[name] += 1
    return 0


def _signature(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(int(s) for s in value.shape), tuple(int(s) for s in value.stride()),
                value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return repr(value)


def _real(value: object) -> object:
    if isinstance(value, torch.Tensor):
        shape = [int(s) for s in value.shape]
        stride = [int(s) for s in value.stride()]
        return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device.type).zero_()
    return value


def _run_probe(target: Any, args: Any, kwargs: Any) -> int:
    real_args, real_kwargs = tree_map(_real, (args, kwargs))
    outs: list[Any] = []
    device = next((t.device for t in tree_leaves((real_args, real_kwargs))
                   if isinstance(t, torch.Tensor)), torch.device("cpu"))
    with torch.no_grad(), PeakWindow(device) as window:
        outs.append(target(*real_args, **real_kwargs))
    out_bytes = sum({storage_key(t): int(t.untyped_storage().nbytes())
                     for t in tree_leaves(outs) if isinstance(t, torch.Tensor)}.values())
    return max(window.peak_bytes - out_bytes, 0)


class _Frozen:
    """Hashable wrapper so FakeTensor-bearing args can ride along lru_cache by signature."""

    def __init__(self, value: object, key: object) -> None:
        self.value, self.key = value, key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Frozen) and other.key == self.key


def _mixed_dtypes(inputs: Any, out: torch.Tensor | None) -> bool:
    """Whether a pointwise op's tensor ``inputs`` are of several dtypes, or of one other than its
    (non-boolean) output's: on CPU, TensorIterator then copies each input not of the common dtype
    into a temporary of that dtype (a ``bool`` dropout mask times a float32 activation: a float32
    copy of the mask, as large as the activation). On CUDA the kernel casts as it reads."""
    dtypes = {t.dtype for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)}
    if len(dtypes) > 1:
        return True
    return out is not None and out.dtype != torch.bool and bool(dtypes) and dtypes != {out.dtype}


def _blas_layout(value: object) -> bool:
    """Whether a matrix operand's last two dims are laid out as BLAS reads them in place: row-major
    or column-major, the other stride at least the dim it steps over (a dim of size 1 takes any
    stride). Not a tensor, or fewer than two dims: True."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return True
    m, n = (concrete_int(s) for s in value.shape[-2:])
    a, b = (concrete_int(s) for s in value.stride()[-2:])
    row = (b == 1 or n == 1) and (a >= max(1, n) or m == 1)
    col = (a == 1 or m == 1) and (b >= max(1, m) or n == 1)
    return row or col


def _blas_copies(inputs: Any) -> bool:
    """Whether a matrix product's kernel copies an operand before calling BLAS: an operand that is
    neither row- nor column-major in its last two dims (stride 0 after an ``expand``, as the
    gradient of a ``sum`` reaches a projection's backward; a transposed slice) is made contiguous
    inside the kernel, a temporary as large as the operand, freed before the op returns."""
    return not all(_blas_layout(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))


def _probed(target: Any, every_op: bool, device: str, dtype: torch.dtype | None = None,
            mixed: bool = False, copies: bool = False) -> bool:
    packet = getattr(target, "overloadpacket", None)
    if packet is None:
        return False
    name = packet.__name__
    if name in LOW_PRECISION_CPU_MATMULS and device == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return True
    if name in LOW_PRECISION_CPU_MATMULS and every_op and copies:
        return True  # see _blas_copies
    if name in PROBED_OPS:
        return every_op or "attention" in name or device == "cuda"
    if not every_op or name in NO_WORKSPACE_OPS:
        return False
    if torch.Tag.pointwise in getattr(target, "tags", ()):
        return mixed and device == "cpu"  # see _mixed_dtypes
    schema = getattr(target, "_schema", None)
    returns_alias = schema is not None and any(r.alias_info is not None for r in schema.returns)
    return not returns_alias  # views and in-place ops allocate nothing


def _rng_wrapped(node: fx.Node) -> tuple[Any, tuple[Any, ...], int] | None:
    """``(op, its args, bytes of a saved RNG state)`` when ``node`` is one of activation
    checkpointing's RNG higher-order ops: ``run_and_save_rng_state(op, *args)`` (forward: the state
    is one of its outputs) or ``run_with_rng_state(state, op, *args)`` (recomputation: it saves the
    current state, sets ``state``, runs ``op`` and sets the saved state back; on CPU that copy is as
    large as ``state``, 5,056 B for the default generator, and lives while ``op`` runs)."""
    name = getattr(node.target, "__name__", "")  # torch.ops.higher_order.<name>
    if name == "run_and_save_rng_state" and node.args:
        return node.args[0], tuple(node.args[1:]), 0
    if name == "run_with_rng_state" and len(node.args) >= 2:
        state = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        ins = [a.meta.get("val") for a in node.args[2:] if isinstance(a, fx.Node)]
        # the CPU generator's state (a CUDA generator's is 16 B, in host memory)
        on_cpu = isinstance(state, torch.Tensor) and all(
            t.device.type == "cpu" for t in ins if isinstance(t, torch.Tensor))
        saved = concrete_int(state.untyped_storage().nbytes()) if on_cpu else 0
        return node.args[1], tuple(node.args[2:]), saved
    return None


def probe_workspace(node: fx.Node, *, every_op: bool = False) -> int:
    """Workspace bytes of ``node``'s kernel; 0 for ops not probed (see module doc) or on failure.
    An op that activation checkpointing runs under a saved RNG state (:func:`_rng_wrapped`) is
    probed as the op itself, plus the state its wrapper saves."""
    if node.op != "call_function":
        return 0

    def unwrap(a: object) -> object:
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    target, args, kwargs, extra = node.target, node.args, node.kwargs, 0
    try:
        wrapped = _rng_wrapped(node)
        if wrapped is not None:
            (target, args, extra), kwargs = wrapped, {}
            args, kwargs = tree_map(unwrap, (args, kwargs))
        # the device and dtype of the op's outputs (of its inputs, for a wrapped op)
        vals = tree_leaves(node.meta.get("val") if wrapped is None else args)
        first = next((v for v in vals if isinstance(v, torch.Tensor)), None)
        device = first.device.type if first is not None else "cpu"
        est = _ESTIMATE.get() if first is not None and is_fake(first) else None
        if est is not None:
            device = est.device  # the target's kernels, not the host's the graph was traced with
        mixed = (every_op and device == "cpu" and wrapped is None
                 and torch.Tag.pointwise in getattr(target, "tags", ())
                 and _mixed_dtypes([a.meta.get("val") for a in node.all_input_nodes], first))
        copies = (every_op and wrapped is None and getattr(getattr(target, "overloadpacket", None), "__name__", "")
                  in LOW_PRECISION_CPU_MATMULS and _blas_copies([a.meta.get("val") for a in node.all_input_nodes]))
        if not _probed(target, every_op, device, first.dtype if first is not None else None, mixed, copies):
            return extra
        if wrapped is None:
            args, kwargs = tree_map(unwrap, (args, kwargs))
        if est is not None:
            return extra + _estimated(target, args, kwargs, est, mixed, copies, first)
        key = (target, _signature(args), _signature(kwargs))
        return extra + _probe_cached(target, _Frozen((args, kwargs), key))
    except Exception:  # noqa: BLE001 - an unprobeable op counts no workspace
        return extra


@functools.lru_cache(maxsize=512)
def _probe_cached(target: Any, frozen: _Frozen) -> int:
    args, kwargs = frozen.value  # type: ignore[misc]
    return _run_probe(target, args, kwargs)
