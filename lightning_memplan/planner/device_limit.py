"""The device as the default memory limit: what this process can hold on its accelerator.

With no ``max_memory``, ``budget="auto"`` on CUDA plans against :func:`device_limit`: the bytes the
caching allocator may reserve on the training device before an out-of-memory error, read when the
plan is decided. That is the device's free memory (``torch.cuda.mem_get_info``) plus what this
process's allocator holds already (``torch.cuda.memory_reserved``: the parameters, batch and cache
are in it, and a forecast counts them in its baseline), less a stated margin
(:data:`CUDA_MARGIN_BYTES`, :data:`COMMUNICATION_MARGIN_BYTES`) for memory that is taken later
outside the caching allocator: kernels and libraries loaded at the first compiled step (cuBLAS,
cuDNN, Triton modules) and, with several processes, the communication library's buffers.

On the CPU there is no such limit: the host's memory is shared with the operating system and
other processes, pages out rather than failing at a fixed byte count, and the profiler's peak is
not what runs out. ``budget="auto"`` there takes the knee of the forecast front (``"knee"`` asks
for it anywhere); ``max_memory`` sets a limit on any device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_memplan.units import format_bytes

__all__ = ["COMMUNICATION_MARGIN_BYTES", "CUDA_MARGIN_BYTES", "DeviceLimit", "device_limit", "usable_bytes"]

#: Device bytes a training process takes outside the caching allocator after the plan is decided:
#: the CUDA libraries' handles and workspaces created at the first kernels of the compiled step,
#: and the code of the kernels inductor loads. A stated margin, not a measurement.
CUDA_MARGIN_BYTES: int = 512 * 2**20

#: More device bytes, with several processes (DDP, FSDP): the communication library's own buffers
#: (NCCL allocates them outside the caching allocator, per communicator). A stated margin.
COMMUNICATION_MARGIN_BYTES: int = 512 * 2**20


@dataclass(frozen=True, kw_only=True)
class DeviceLimit:
    """The bytes a plan's forecast total must stay under on a device, and where they came from."""

    #: The limit: the most the caching allocator of this process may reserve (bytes).
    bytes: int
    #: Free device memory when it was read (bytes).
    free_bytes: int
    #: Bytes this process's caching allocator held (reserved) when it was read.
    held_bytes: int
    #: The margin subtracted (bytes): :data:`CUDA_MARGIN_BYTES`, plus
    #: :data:`COMMUNICATION_MARGIN_BYTES` with several processes.
    margin_bytes: int
    #: The device, as torch names it (``"cuda:0"``).
    device: str

    @property
    def source(self) -> str:
        """Where the limit came from, in words (for the plan table)."""
        return (f"{self.device}'s memory: {format_bytes(self.free_bytes)} free + {format_bytes(self.held_bytes)} "
                f"held by this process - {format_bytes(self.margin_bytes)} margin")


def usable_bytes(*, free: int, held: int, margin: int) -> int:
    """``free + held - margin``, at least 0: what a process holding ``held`` bytes may reserve when
    ``free`` bytes of the device are free and ``margin`` are kept for memory taken outside its allocator.

    Raises:
        ValueError: a negative argument.
    """
    for name, value in (("free", free), ("held", held), ("margin", margin)):
        if value < 0:
            raise ValueError(f"`usable_bytes({name}={value!r})` must be a byte count >= 0.")
    return max(free + held - margin, 0)


def device_limit(device: torch.device | str, *, processes: int = 1) -> DeviceLimit | None:
    """The default limit on ``device`` (see the module docstring), read now; ``None`` for a device
    without one (the CPU, and anything not CUDA). ``processes``: the training processes of the fit
    (the strategy's world size); above 1 the communication margin is added."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    held = int(torch.cuda.memory_reserved(index))
    margin = CUDA_MARGIN_BYTES + (COMMUNICATION_MARGIN_BYTES if processes > 1 else 0)
    return DeviceLimit(bytes=usable_bytes(free=int(free), held=held, margin=margin), free_bytes=int(free),
                       held_bytes=held, margin_bytes=margin, device=f"cuda:{index}")
