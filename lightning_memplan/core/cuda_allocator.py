"""A pure-Python model of PyTorch's CUDA caching allocator, to predict its memory statistics.

Given the exact sequence of allocations and frees (requested sizes in bytes), the model gives what
``torch.cuda.memory_stats()`` reports: ``allocated_bytes`` (sum of the allocated *block* sizes,
after rounding and the no-split rules; ``torch.cuda.max_memory_allocated()`` is its peak),
``reserved_bytes`` (sum of the cudaMalloc'd segment sizes; ``max_memory_reserved()``) and
``requested_bytes`` (sum of the unrounded requests), each with its peak. All sizes are bytes.

Modelled, from ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``; the constants
live in ``c10/core/AllocatorConfig.h`` in recent releases) in the default configuration:

* ``NativeCachingAllocator::allocate`` / ``raw_alloc``: a request of 0 bytes never reaches the
  allocator (null pointer, no block, no statistics); ``free(nullptr)`` is a no-op.
* ``round_size``: requests round up to a multiple of ``kMinBlockSize`` = 512 B (at least 512).
* ``get_pool``: the small pool iff the rounded size is <= ``kSmallSize`` = 1 MiB, else the large pool.
* ``get_free_block`` with ``BlockComparatorSize``: best fit, the smallest free block of the pool
  with size >= the rounded size, lowest address among equal sizes. (The ``max_split_size``
  oversize rules never trigger: it is unlimited by default.)
* ``get_allocation_size`` / ``alloc_block``: with no fitting block a new segment is cudaMalloc'd:
  ``kSmallBuffer`` = 2 MiB for the small pool, ``kLargeBuffer`` = 20 MiB for sizes < ``kMinLargeAlloc``
  = 10 MiB, else the size rounded up to ``kRoundLarge`` = 2 MiB.
* ``should_split``: the block is split iff the remainder is >= 512 B (small pool) or > 1 MiB (large
  pool); otherwise the *whole* block is allocated (and counted in ``allocated_bytes``).
* ``alloc_found_block``: the allocated part keeps the block's (lower) address, the remainder
  goes back to the pool at ``ptr + size``.
* ``free`` / ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours
  in the same segment.
* ``release_cached_blocks`` / ``release_blocks`` (``torch.cuda.empty_cache``): releases the free
  blocks that are whole segments (no ``prev``/``next``).
* Statistics as in ``increase_stat`` / ``decrease_stat`` / ``resetPeakStats``: allocated counts
  ``block->size``, requested counts ``orig_size``, reserved counts the segment size; a peak is
  raised on every increase and ``reset_peak`` sets peaks to the current values.
* With ``memory_limit`` (like ``torch.cuda.set_per_process_memory_fraction``, whose check in
  ``alloc_block`` is ``total_allocated_memory + size > allowed_memory_maximum``): when a new
  segment would pass the limit, the wholly free segments are released (``release_cached_blocks``)
  and the cudaMalloc retried, and if it still does not fit :class:`OutOfMemoryError` is raised.

Not modelled: multiple streams (``record_stream``, cross-stream events: blocks are reused only on
their own stream), several devices, expandable segments, any non-default ``PYTORCH_CUDA_ALLOC_CONF``
/ ``PYTORCH_ALLOC_CONF`` (``max_split_size_mb``, ``roundup_power2_divisions``,
``garbage_collection_threshold``, ``large_segment_size_mb``, the ``cudaMallocAsync`` backend),
CUDA graph private pools, a cudaMalloc failing because the physical device is full (only the
explicit ``memory_limit`` above), and memory outside the caching allocator (CUDA context, NCCL,
cuBLAS workspaces allocated through other paths).

Addresses: segments get increasing fake base addresses. The real cudaMalloc may order segments
differently; that only matters when best fit has to choose between equal-size free blocks of
different segments whose neighbourhoods differ, which can change later merging.
"""
from __future__ import annotations

import bisect
import operator
from collections.abc import Hashable, Iterable

__all__ = [
    "K_LARGE_BUFFER", "K_MIN_BLOCK_SIZE", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_BUFFER",
    "K_SMALL_SIZE", "CachingAllocatorModel", "OutOfMemoryError", "allocation_size", "replay",
    "round_size", "should_split",
]

K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # "small" allocations are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 << 20  # allocations between 1 and 10 MiB may use K_LARGE_BUFFER
K_ROUND_LARGE = 2 << 20  # round up large segments to 2 MiB
K_LARGE_BUFFER = 20 << 20  # "large" allocations may be packed in 20 MiB segments
_ONE_EXABYTE = 1 << 60  # NativeCachingAllocator::allocate refuses sizes >= 1 EB


class OutOfMemoryError(MemoryError):
    """A new segment would exceed the model's ``memory_limit``, even after releasing the cache."""


def round_size(nbytes: int) -> int:
    """Block size for a request of ``nbytes`` bytes (``round_size``): a multiple of 512, at least 512."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """Bytes cudaMalloc'd for a new segment serving a rounded ``size`` (``get_allocation_size``)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def should_split(block_size: int, size: int, small: bool) -> bool:
    """Whether a free block of ``block_size`` serving a rounded ``size`` is split (``should_split``).

    Small pool: iff the remainder is >= 512 B; large pool: iff the remainder is > 1 MiB, else the
    whole block is handed out.
    """
    remaining = block_size - size
    return remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE


class _Block:
    """A contiguous range of a segment; ``prev``/``next`` are its neighbours in the segment."""

    __slots__ = ("allocated", "next", "prev", "ptr", "requested", "size", "small")

    def __init__(self, ptr: int, size: int, small: bool) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small
        self.allocated = False
        self.requested = 0
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocatorModel:
    """The caching allocator of one device and one stream, driven by keyed allocations and frees.

    Attributes (bytes): ``allocated_bytes``, ``reserved_bytes``, ``requested_bytes`` (current) and
    ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``peak_requested_bytes``. Invariants:
    ``requested_bytes <= allocated_bytes <= reserved_bytes``, every current value <= its peak, and
    ``reserved_bytes`` is the sum of :attr:`segment_sizes`.

    Args:
        memory_limit: optional cap on ``reserved_bytes`` (bytes), as set by
            ``torch.cuda.set_per_process_memory_fraction``; None for no limit.
    """

    def __init__(self, memory_limit: int | None = None) -> None:
        if memory_limit is not None and operator.index(memory_limit) < 0:
            raise ValueError(f"memory_limit={memory_limit!r} must be >= 0 bytes or None")
        self.memory_limit = memory_limit
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.requested_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_requested_bytes = 0
        self._live: dict[Hashable, _Block | None] = {}  # None: a 0-byte allocation, no block
        self._pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # sorted (size, ptr)
        self._free: dict[int, _Block] = {}  # free blocks by address
        self._segments: dict[int, int] = {}  # segment base address -> segment size
        self._next_address = 1 << 32

    # --- public API -------------------------------------------------------------------------

    def malloc(self, key: Hashable, nbytes: int) -> int:
        """Allocate ``nbytes`` bytes under ``key``; returns the block size given (0 for 0 bytes).

        Raises:
            ValueError: ``nbytes`` is negative or ``key`` is already live.
            TypeError: ``nbytes`` is not an integer.
            OutOfMemoryError: ``nbytes`` >= 1 EB, or a new segment would exceed ``memory_limit``.
        """
        n = operator.index(nbytes)
        if n < 0:
            raise ValueError(f"malloc({key!r}, {nbytes!r}): nbytes must be >= 0")
        if key in self._live:
            raise ValueError(f"malloc({key!r}, {nbytes!r}): key {key!r} is already allocated")
        if n >= _ONE_EXABYTE:
            raise OutOfMemoryError(f"malloc({key!r}, {n}): more than 1 EB")
        if n == 0:
            self._live[key] = None
            return 0
        size = round_size(n)
        small = size <= K_SMALL_SIZE
        block = self._take_free_block(size, small) or self._new_segment(size, small)
        if should_split(block.size, size, small):
            block = self._split(block, size)
        block.allocated = True
        block.requested = n
        self._live[key] = block
        self.allocated_bytes += block.size
        self.requested_bytes += n
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        return block.size

    def free(self, key: Hashable) -> None:
        """Free the allocation under ``key``; its block merges with free neighbours and is cached.

        Raises:
            KeyError: ``key`` is not live (never allocated, or already freed).
        """
        if key not in self._live:
            raise KeyError(f"free({key!r}): no live allocation under this key")
        block = self._live.pop(key)
        if block is None:
            return
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        block.allocated = False
        block.requested = 0
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._merge(block, neighbour)
        self._insert_free(block)

    def reset_peak(self) -> None:
        """Set every peak to its current value, like ``torch.cuda.reset_peak_memory_stats``."""
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = self.reserved_bytes
        self.peak_requested_bytes = self.requested_bytes

    def empty_cache(self) -> None:
        """Release the wholly free segments, like ``torch.cuda.empty_cache``."""
        for block in [b for b in self._free.values() if b.prev is None and b.next is None]:
            self._remove_free(block)
            del self._segments[block.ptr]
            self.reserved_bytes -= block.size

    @property
    def segment_sizes(self) -> list[int]:
        """Sizes in bytes of the cudaMalloc'd segments, in address order."""
        return [self._segments[base] for base in sorted(self._segments)]

    def stats(self) -> dict[str, int]:
        """Current and peak values under their ``torch.cuda.memory_stats()`` names ("all" pools)."""
        return {
            "allocated_bytes.all.current": self.allocated_bytes,
            "allocated_bytes.all.peak": self.peak_allocated_bytes,
            "reserved_bytes.all.current": self.reserved_bytes,
            "reserved_bytes.all.peak": self.peak_reserved_bytes,
            "requested_bytes.all.current": self.requested_bytes,
            "requested_bytes.all.peak": self.peak_requested_bytes,
        }

    # --- internals ----------------------------------------------------------------------------

    def _segment_address(self, size: int) -> int:
        """Base address for a new segment of ``size`` bytes (increasing, never overlapping)."""
        base = self._next_address
        self._next_address += size
        return base

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._pools[block.small], (block.size, block.ptr))
        self._free[block.ptr] = block

    def _remove_free(self, block: _Block) -> None:
        pool = self._pools[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.ptr))]
        del self._free[block.ptr]

    def _take_free_block(self, size: int, small: bool) -> _Block | None:
        """Best fit (``get_free_block``): smallest free block >= ``size``, lowest address first."""
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        block = self._free[pool[i][1]]
        self._remove_free(block)
        return block

    def _new_segment(self, size: int, small: bool) -> _Block:
        """cudaMalloc a segment for ``size`` (``alloc_block``), releasing the cache at the limit."""
        nbytes = allocation_size(size)
        limit = self.memory_limit
        if limit is not None and self.reserved_bytes + nbytes > limit:
            self.empty_cache()
            if self.reserved_bytes + nbytes > limit:
                raise OutOfMemoryError(
                    f"a new {nbytes}-byte segment would exceed memory_limit={limit} "
                    f"(reserved {self.reserved_bytes}, allocated {self.allocated_bytes})"
                )
        base = self._segment_address(nbytes)
        self._segments[base] = nbytes
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return _Block(base, nbytes, small)

    def _split(self, block: _Block, size: int) -> _Block:
        """``alloc_found_block``: a new ``size`` block at ``block.ptr``; ``block`` keeps the rest."""
        head = _Block(block.ptr, size, block.small)
        head.prev = block.prev
        if head.prev is not None:
            head.prev.next = head
        head.next = block
        block.prev = head
        block.ptr += size
        block.size -= size
        self._insert_free(block)
        return head

    def _merge(self, dst: _Block, src: _Block) -> None:
        """``try_merge_blocks``: ``dst`` absorbs its free neighbour ``src``."""
        self._remove_free(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size


def replay(
    events: Iterable[tuple[str, Hashable, int]], model: CachingAllocatorModel | None = None
) -> CachingAllocatorModel:
    """Apply ``("alloc", key, nbytes)`` / ``("free", key, 0)`` events (bytes) to ``model`` (or a new one).

    Returns the model, whose peaks then predict ``torch.cuda.max_memory_allocated()`` /
    ``max_memory_reserved()`` for that sequence (starting from ``model``'s state).

    Raises:
        ValueError: an unknown event kind, or as :meth:`CachingAllocatorModel.malloc`.
        KeyError: as :meth:`CachingAllocatorModel.free`.
    """
    model = CachingAllocatorModel() if model is None else model
    for kind, key, nbytes in events:
        if kind == "alloc":
            model.malloc(key, nbytes)
        elif kind == "free":
            model.free(key)
        else:
            raise ValueError(f"unknown event kind {kind!r} (expected 'alloc' or 'free')")
    return model
