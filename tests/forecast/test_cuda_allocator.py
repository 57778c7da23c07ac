"""The CUDA caching allocator model: rounding, segment sizes, splitting, best fit, merging, stats."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pytest
import torch

from lightning_memplan.core.cuda_allocator import (
    CachingAllocatorModel,
    OutOfMemoryError,
    allocation_size,
    replay,
    round_size,
)

KiB = 1 << 10
MiB = 1 << 20

STAT_NAMES = (
    "allocated_bytes.all.current", "allocated_bytes.all.peak",
    "reserved_bytes.all.current", "reserved_bytes.all.peak",
    "requested_bytes.all.current", "requested_bytes.all.peak",
)


def test_small_requests_round_to_512_bytes() -> None:
    m = CachingAllocatorModel()
    assert [m.malloc(i, n) for i, n in enumerate([1, 511, 512, 513, 1000])] == [512, 512, 512, 1024, 1024]
    assert m.allocated_bytes == 3 * 512 + 2 * 1024
    assert m.requested_bytes == 1 + 511 + 512 + 513 + 1000
    assert m.reserved_bytes == 2 * MiB  # all in one small segment
    assert round_size(0) == 512 and round_size(MiB + 1) == MiB + 512


def test_medium_request_carves_a_20mib_segment_and_splits() -> None:
    m = CachingAllocatorModel()
    assert m.malloc("a", 3 * MiB // 2) == 3 * MiB // 2
    assert (m.allocated_bytes, m.reserved_bytes) == (3 * MiB // 2, 20 * MiB)
    assert m.malloc("b", 9 * MiB) == 9 * MiB  # fits in the 18.5 MiB remainder
    assert m.segment_sizes == [20 * MiB]


def test_large_request_takes_whole_block_when_remainder_is_at_most_1mib() -> None:
    m = CachingAllocatorModel()
    assert m.malloc("a", 23 * MiB // 2) == 12 * MiB  # 12 MiB segment, 0.5 MiB remainder not split
    assert (m.allocated_bytes, m.reserved_bytes, m.requested_bytes) == (12 * MiB, 12 * MiB, 23 * MiB // 2)
    assert m.malloc("b", 39 * MiB // 2) == 20 * MiB  # >= 10 MiB: rounded to 2 MiB, not split
    assert m.malloc("c", 10 * MiB) == 10 * MiB  # exactly kMinLargeAlloc: its own 10 MiB segment
    assert m.segment_sizes == [12 * MiB, 20 * MiB, 10 * MiB]
    assert [allocation_size(s) for s in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB + 512)] == [
        2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 12 * MiB]


def test_reuse_of_a_cached_large_block_splits_only_above_1mib() -> None:
    m = CachingAllocatorModel()
    m.malloc("a", 12 * MiB)
    m.free("a")
    assert m.malloc("b", 11 * MiB) == 12 * MiB  # remainder exactly 1 MiB: not > 1 MiB, whole block
    assert m.allocated_bytes == 12 * MiB
    m.free("b")
    assert m.malloc("c", 45 * MiB // 4) == 12 * MiB  # remainder 0.75 MiB
    m.free("c")
    assert m.malloc("d", 21 * MiB // 2) == 21 * MiB // 2  # remainder 1.5 MiB: split
    assert m.malloc("e", MiB + 512) == 3 * MiB // 2  # the 1.5 MiB remainder, whole (0.5 MiB left)
    assert (m.allocated_bytes, m.requested_bytes, m.reserved_bytes) == (12 * MiB, 23 * MiB // 2 + 512, 12 * MiB)


def test_small_requests_share_a_2mib_segment() -> None:
    m = CachingAllocatorModel()
    for i in range(4):
        m.malloc(i, 512 * KiB)
    assert m.reserved_bytes == 2 * MiB
    m.malloc(4, 1)
    assert m.segment_sizes == [2 * MiB, 2 * MiB]
    m.malloc("one_mib", MiB)  # exactly 1 MiB is still small: the second 2 MiB segment
    assert m.reserved_bytes == 4 * MiB
    m.malloc("large", MiB + 1)  # rounds to 1 MiB + 512: large pool, a 20 MiB segment
    assert m.reserved_bytes == 24 * MiB


def test_free_merges_with_both_neighbours() -> None:
    m = CachingAllocatorModel()
    for key in "abc":
        m.malloc(key, 6 * MiB)  # one 20 MiB segment: a | b | c | 2 MiB free
    m.free("b")
    m.free("a")  # merges with its free next neighbour b: one 12 MiB block
    assert m.malloc("big", 9 * MiB) == 9 * MiB
    assert m.reserved_bytes == 20 * MiB  # no new segment
    m.free("big")
    m.free("c")  # merges with prev (a+b) and next (the tail): the whole segment is free again
    assert m.allocated_bytes == 0
    assert m.malloc("whole", 19 * MiB) == 20 * MiB
    assert m.reserved_bytes == 20 * MiB


def test_best_fit_picks_the_smallest_sufficient_block() -> None:
    m = CachingAllocatorModel()
    for key, mib in [("a", 3), ("x", 2), ("b", 5), ("y", 2), ("c", 4), ("z", 2)]:
        m.malloc(key, mib * MiB)  # 18 MiB of a 20 MiB segment, 2 MiB tail
    for key in "abc":
        m.free(key)  # free blocks of 3, 5, 4 and 2 MiB, separated by live ones
    assert m.malloc("p", 7 * MiB // 2) == 4 * MiB  # c (first fit would split b: 3.5 MiB)
    assert m.malloc("q", 5 * MiB // 2) == 3 * MiB  # a
    assert m.malloc("r", 9 * MiB // 2) == 5 * MiB  # b
    assert m.reserved_bytes == 20 * MiB


def test_best_fit_takes_the_lowest_address_among_equal_sizes() -> None:
    m = CachingAllocatorModel()
    for key, mib in [("a", 4), ("k1", 2), ("b", 4), ("k2", 2)]:
        m.malloc(key, mib * MiB)  # a | k1 | b | k2 | 8 MiB tail
    m.free("a")
    m.free("b")
    m.malloc("p", 4 * MiB)  # takes a (lower address), b stays free
    m.free("k2")  # merges b + k2 + tail = 14 MiB (had it taken b: only k2 + tail = 10 MiB)
    assert m.malloc("q", 13 * MiB) == 14 * MiB
    assert m.reserved_bytes == 20 * MiB


def test_peaks_and_reset_peak() -> None:
    m = CachingAllocatorModel()
    m.malloc("a", 100)  # 512 B in a 2 MiB segment
    m.malloc("b", 23 * MiB // 2)  # a whole 12 MiB segment
    m.free("a")
    m.free("b")
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_requested_bytes) == (
        12 * MiB + 512, 14 * MiB, 23 * MiB // 2 + 100)
    assert (m.allocated_bytes, m.reserved_bytes, m.requested_bytes) == (0, 14 * MiB, 0)
    m.reset_peak()
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_requested_bytes) == (0, 14 * MiB, 0)
    m.malloc("c", 100)  # reuses the cached small segment
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.peak_requested_bytes) == (512, 14 * MiB, 100)
    assert m.stats()["allocated_bytes.all.peak"] == 512


def test_empty_cache_releases_only_wholly_free_segments() -> None:
    m = CachingAllocatorModel()
    m.malloc("kept", 3 * MiB // 2)  # 20 MiB segment, partly free: stays
    m.malloc("big", 30 * MiB)  # too big for the 18.5 MiB remainder: its own 30 MiB segment
    m.malloc("small", 100)  # 2 MiB segment
    m.free("big")
    m.free("small")
    assert m.reserved_bytes == 52 * MiB
    m.empty_cache()
    assert m.segment_sizes == [20 * MiB]
    assert (m.reserved_bytes, m.peak_reserved_bytes, m.allocated_bytes) == (20 * MiB, 52 * MiB, 3 * MiB // 2)
    m.free("kept")
    m.empty_cache()
    assert (m.reserved_bytes, m.segment_sizes) == (0, [])


def test_zero_byte_allocation_counts_nothing() -> None:
    m = CachingAllocatorModel()
    assert m.malloc("empty", 0) == 0
    assert (m.allocated_bytes, m.reserved_bytes, m.requested_bytes) == (0, 0, 0)
    with pytest.raises(ValueError, match="already allocated"):
        m.malloc("empty", 8)
    m.free("empty")
    with pytest.raises(KeyError, match="no live allocation"):
        m.free("empty")


def test_bad_input_is_rejected_clearly() -> None:
    m = CachingAllocatorModel()
    with pytest.raises(ValueError, match="must be >= 0"):
        m.malloc("a", -1)
    m.malloc("a", 10)
    with pytest.raises(ValueError, match="already allocated"):
        m.malloc("a", 10)
    with pytest.raises(KeyError, match="'nope'"):
        m.free("nope")
    with pytest.raises(TypeError):
        m.malloc("f", 1.5)  # type: ignore[arg-type]
    with pytest.raises(OutOfMemoryError, match="1 EB"):
        m.malloc("huge", 1 << 60)
    with pytest.raises(ValueError, match="unknown event kind"):
        replay([("realloc", "a", 1)], m)
    with pytest.raises(ValueError, match="memory_limit"):
        CachingAllocatorModel(memory_limit=-1)
    assert (m.allocated_bytes, m.requested_bytes) == (512, 10)  # failed calls changed nothing


def test_replay() -> None:
    events = [("alloc", "x", 3 * MiB // 2), ("alloc", "y", 100), ("free", "x", 0), ("alloc", 7, 11 * MiB)]
    m = replay(events)  # 11 MiB reuses the freed 20 MiB segment, split
    assert (m.allocated_bytes, m.reserved_bytes, m.peak_allocated_bytes) == (512 + 11 * MiB, 22 * MiB, 11 * MiB + 512)
    same = CachingAllocatorModel()
    assert replay(events[:2], same) is same and replay(events[2:], same).stats() == m.stats()


def test_memory_limit_releases_the_cache_then_raises() -> None:
    m = CachingAllocatorModel(memory_limit=40 * MiB)
    m.malloc("a", 30 * MiB)
    m.free("a")
    m.malloc("b", 32 * MiB)  # 30 + 32 > 40: the cached 30 MiB segment is released first
    assert (m.reserved_bytes, m.peak_reserved_bytes, m.segment_sizes) == (32 * MiB, 32 * MiB, [32 * MiB])
    with pytest.raises(OutOfMemoryError, match="memory_limit"):
        m.malloc("c", 10 * MiB)
    with pytest.raises(OutOfMemoryError):
        m.malloc("d", 3 * MiB // 2)  # a 20 MiB segment: 32 + 20 > 40 as well
    assert (m.allocated_bytes, m.reserved_bytes) == (32 * MiB, 32 * MiB)
    m.malloc("e", 100)  # a 2 MiB segment fits
    assert m.reserved_bytes == 34 * MiB


# --- random sequences: invariants, independence from segment addresses, and the real allocator ---

_SPECIAL_SIZES = [1, 511, 512, 513, MiB - 1, MiB, MiB + 1, 2 * MiB, 10 * MiB - 1, 10 * MiB,
                  10 * MiB + 1, 39 * MiB // 2, 20 * MiB, 20 * MiB + 1, 40 * MiB]


def _random_events(seed: int, n: int = 300, max_live: int = 40) -> list[tuple[str, int | None, int]]:
    """Allocs of 1 B .. 40 MiB and frees; one reset_peak at n/3 and one empty_cache at 2n/3."""
    rng = random.Random(seed)
    live: list[int] = []
    events: list[tuple[str, int | None, int]] = []
    for i in range(n):
        if i in (n // 3, 2 * n // 3):
            events.append(("reset_peak" if i == n // 3 else "empty_cache", None, 0))
        elif live and (len(live) >= max_live or rng.random() < 0.45):
            events.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            r = rng.random()
            if r < 0.15:
                nbytes = rng.choice(_SPECIAL_SIZES)
            elif r < 0.5:
                nbytes = rng.randint(1, 40 * MiB)
            else:
                nbytes = round(2 ** rng.uniform(0, math.log2(40 * MiB)))
            events.append(("alloc", i, nbytes))
            live.append(i)
    return events


def _model_trace(model: CachingAllocatorModel, events: list[tuple[str, int | None, int]]) -> list[list[int]]:
    trace = []
    for kind, key, nbytes in events:
        if kind == "alloc":
            model.malloc(key, nbytes)
        elif kind == "free":
            model.free(key)
        elif kind == "empty_cache":
            model.empty_cache()
        else:
            model.reset_peak()
        stats = model.stats()
        trace.append([stats[name] for name in STAT_NAMES])
    return trace


class _ShuffledAddresses(CachingAllocatorModel):
    """Segments at random, non-overlapping addresses: the order cudaMalloc returns is unknown."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._slots: set[int] = set()

    def _segment_address(self, size: int) -> int:
        while (slot := self._rng.randrange(1 << 16)) in self._slots:
            pass
        self._slots.add(slot)
        return slot << 40


GPU_SEED = 0


@pytest.mark.parametrize("seed", range(5))
def test_invariants_over_random_sequences(seed: int) -> None:
    m = CachingAllocatorModel()
    events = _random_events(seed)
    for allocated, peak_allocated, reserved, peak_reserved, requested, peak_requested in _model_trace(m, events):
        assert requested <= allocated <= reserved
        assert allocated <= peak_allocated and reserved <= peak_reserved and requested <= peak_requested
    assert m.reserved_bytes == sum(m.segment_sizes)
    freed = {key for kind, key, _ in events if kind == "free"}
    for kind, key, _ in events:
        if kind == "alloc" and key not in freed:
            m.free(key)
    assert (m.allocated_bytes, m.requested_bytes) == (0, 0)
    m.empty_cache()  # everything merged back into whole free segments
    assert (m.reserved_bytes, m.segment_sizes) == (0, [])


def test_gpu_sequence_does_not_depend_on_segment_addresses() -> None:
    """So the CUDA comparison below checks the rules, not cudaMalloc's address order."""
    events = _random_events(GPU_SEED)
    expected = _model_trace(CachingAllocatorModel(), events)
    for seed in range(20):
        assert _model_trace(_ShuffledAddresses(seed), events) == expected, seed


_GPU_SCRIPT = r"""
import json, sys, torch
names = json.loads(sys.argv[1])
events = json.load(sys.stdin)
torch.cuda.init()
def snap():
    stats = torch.cuda.memory_stats()
    return [stats.get(name) for name in names]
out = {"backend": torch.cuda.get_allocator_backend(), "start": snap(), "trace": []}
live = {}
for kind, key, nbytes in events:
    if kind == "alloc":
        live[key] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    elif kind == "free":
        del live[key]
    elif kind == "empty_cache":
        torch.cuda.empty_cache()
    else:
        torch.cuda.reset_peak_memory_stats()
    out["trace"].append(snap())
print(json.dumps(out))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_model_matches_the_real_cuda_caching_allocator() -> None:
    events = _random_events(GPU_SEED)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                        "PYTORCH_NO_CUDA_MEMORY_CACHING")}
    done = subprocess.run(
        [sys.executable, "-c", _GPU_SCRIPT, json.dumps(STAT_NAMES)], input=json.dumps(events),
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr
    real = json.loads(done.stdout.strip().splitlines()[-1])
    assert real["backend"] == "native"
    assert all(not v for v in real["start"]), real["start"]  # the cache starts empty
    expected = _model_trace(CachingAllocatorModel(), events)
    for i, (event, got, want) in enumerate(zip(events, real["trace"], expected)):
        if got[4] is None:  # no requested_bytes in this torch: compare the rest
            got, want = got[:4], want[:4]
        assert got == want, f"event {i} {event}: real {dict(zip(STAT_NAMES, got))} != model {want}"
    assert len(real["trace"]) == len(events)
