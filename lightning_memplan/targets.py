"""Devices a forecast can be made for without one at hand: plain data, no torch.

A :class:`Target` names the device a training step is forecast for. ``"cpu"`` is the host;
``"cuda"`` is a CUDA GPU whose memory is not named (the forecast gives allocated and reserved bytes,
and "fits?" is judged against ``max_memory`` only); the named GPUs carry their memory and the
properties inductor and torch's attention dispatch read (streaming multiprocessors, compute
capability). Memory is the device's total in bytes as ``torch.cuda.get_device_properties(i).total_memory``
reports it (the vendor's figure in GB of 10^9 bytes; the driver and the CUDA context take some of it,
see :data:`CUDA_CONTEXT_BYTES`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CUDA_CONTEXT_BYTES", "TARGETS", "Target", "resolve_target"]

#: Bytes of device memory a CUDA process holds outside the caching allocator (the CUDA context,
#: cuBLAS/cuDNN handles and their workspaces): not in ``memory_reserved``, yet out of the device's
#: total. A stated margin (about 0.5 GiB on Hopper with torch 2.x), subtracted from a named target's
#: memory before "fits?" is judged.
CUDA_CONTEXT_BYTES: int = 512 * 2**20


@dataclass(frozen=True, kw_only=True)
class Target:
    """A device a step is forecast for."""

    #: The name ``target=`` takes (``"cpu"``, ``"cuda"``, ``"H100"``, ...).
    name: str
    #: The device type torch runs on: ``"cpu"`` or ``"cuda"``.
    kind: Literal["cpu", "cuda"]
    #: Total device memory in bytes; ``None`` when not named (``"cpu"``, ``"cuda"``).
    memory_bytes: int | None = None
    #: Streaming multiprocessors (CUDA); ``None`` for the host or an unnamed GPU.
    sms: int | None = None
    #: Compute capability ``(major, minor)`` (CUDA); ``None`` for the host or an unnamed GPU.
    capability: tuple[int, int] | None = None
    #: What the device is, in words (for tables).
    description: str = ""

    @property
    def usable_bytes(self) -> int | None:
        """``memory_bytes`` less what a CUDA process holds outside the allocator
        (:data:`CUDA_CONTEXT_BYTES`): the most ``memory_reserved`` can grow to; ``None`` when the
        memory is not named."""
        if self.memory_bytes is None:
            return None
        return max(self.memory_bytes - (CUDA_CONTEXT_BYTES if self.kind == "cuda" else 0), 0)


def _gpu(name: str, gb: int, sms: int, cc: tuple[int, int], description: str) -> Target:
    return Target(name=name, kind="cuda", memory_bytes=gb * 10**9, sms=sms, capability=cc, description=description)


#: The named targets, by the name ``target=`` takes. Memory in the vendor's GB (10^9 bytes).
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target(name="cpu", kind="cpu", description="the host (torch's CPU kernels)"),
    Target(name="cuda", kind="cuda", description="a CUDA GPU, memory not named"),
    _gpu("T4", 16, 40, (7, 5), "NVIDIA T4 16 GB"),
    _gpu("V100-16GB", 16, 80, (7, 0), "NVIDIA V100 16 GB"),
    _gpu("V100-32GB", 32, 80, (7, 0), "NVIDIA V100 32 GB"),
    _gpu("A10G", 24, 80, (8, 6), "NVIDIA A10G 24 GB"),
    _gpu("L4", 24, 58, (8, 9), "NVIDIA L4 24 GB"),
    _gpu("RTX-3090", 24, 82, (8, 6), "NVIDIA GeForce RTX 3090 24 GB"),
    _gpu("RTX-4090", 24, 128, (8, 9), "NVIDIA GeForce RTX 4090 24 GB"),
    _gpu("A100-40GB", 40, 108, (8, 0), "NVIDIA A100 40 GB"),
    _gpu("A100-80GB", 80, 108, (8, 0), "NVIDIA A100 80 GB"),
    _gpu("L40S", 48, 142, (8, 9), "NVIDIA L40S 48 GB"),
    _gpu("H100", 80, 132, (9, 0), "NVIDIA H100 SXM 80 GB"),
    _gpu("H100-PCIe", 80, 114, (9, 0), "NVIDIA H100 PCIe 80 GB"),
    _gpu("H200", 141, 132, (9, 0), "NVIDIA H200 141 GB"),
    _gpu("B200", 180, 148, (10, 0), "NVIDIA B200 180 GB"),
)}

_ALIASES: dict[str, str] = {"a100": "A100-80GB", "v100": "V100-32GB"}


def resolve_target(name: object, call: str, arg: str = "target") -> Target:
    """The :class:`Target` named ``name`` (case-insensitive; ``"A100"`` is the 80 GB one, ``"V100"``
    the 32 GB one).

    Raises:
        ValueError: quoting ``call(arg=name)`` and listing the allowed names.
    """
    if isinstance(name, Target):
        return name
    if isinstance(name, str):
        by_lower = {k.lower(): v for k, v in TARGETS.items()}
        key = name.strip().lower()
        key = _ALIASES.get(key, key).lower()
        if key in by_lower:
            return by_lower[key]
    raise ValueError(f"`{call}({arg}={name!r})` is not a known device. Expected one of "
                     f"{', '.join(repr(n) for n in TARGETS)} (case-insensitive).")
