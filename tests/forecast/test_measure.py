"""Measured peaks: profiler memory events on CPU; a running peak over signed deltas."""
from __future__ import annotations

import pytest
import torch

from lightning_memplan import measure_peak
from lightning_memplan.core.peaks import running_peak
from lightning_memplan.measure import PeakWindow


def test_running_peak() -> None:
    assert running_peak([]) == 0
    assert running_peak([100, 50, -120, 200, -230]) == 230
    assert running_peak([-10, 5]) == 0  # a free of older memory never lowers the start below 0


def test_cpu_peak_counts_live_tensors_above_what_was_in_use() -> None:
    held = torch.ones(10_000)  # in use before: not counted

    def work() -> None:
        a = torch.empty(1000, dtype=torch.float32)   # 4000 B
        b = torch.empty(500, dtype=torch.float64)    # 4000 B, both live: 8000
        del a, b
        c = torch.empty(1500, dtype=torch.float32)   # 6000 B alone
        del c

    assert measure_peak(work, device="cpu") == 8000
    assert held.numel() == 10_000


def test_window_context_manager() -> None:
    with PeakWindow("cpu") as w:
        x = torch.empty(256, dtype=torch.uint8)
        del x
    assert w.peak_bytes == 256
    assert w.requested_peak_bytes == 256  # the CPU profiler counts requested bytes already


def test_a_free_of_a_block_made_before_the_window_is_merged_in_on_cpu() -> None:
    """The CPU profiler records no event for freeing a block allocated before it started: a
    window over "free 4 MB made earlier, then make 2 MB" peaks at 2 MB unless that free is noted."""
    import time

    def work(note: bool) -> int:
        early = torch.ones(1024 * 1024)  # 4 MB, before the window
        with PeakWindow("cpu") as w:
            del early
            freed = time.time_ns()
            late = torch.ones(512 * 1024)  # 2 MB
            if note:
                w.note_free(4 * 1024 * 1024, freed)
        del late
        return w.peak_bytes

    assert work(note=False) >= 2 * 1024 * 1024
    assert work(note=True) < 1024 * 1024


@pytest.mark.parametrize("device", ["tpu", 3.5])
def test_bad_device(device: object) -> None:
    with pytest.raises(ValueError, match=r"measure_peak\(device=.*\)` is not (a device|supported)\. Expected 'cpu' or 'cuda'"):
        measure_peak(lambda: None, device=device)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is missing")
def test_cuda_missing() -> None:
    with pytest.raises(ValueError, match=r"measure_peak\(device='cuda'\)`: CUDA is not available on this machine; use 'cpu'"):
        measure_peak(lambda: None, device="cuda")


def test_not_callable() -> None:
    with pytest.raises(ValueError, match=r"measure_peak\(step_fn=42\)` is not callable"):
        measure_peak(42)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak() -> None:
    def work() -> None:
        a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del a

    assert measure_peak(work, device="cuda") == 1 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_requested_peak_leaves_out_the_allocators_rounding() -> None:
    # A cached 4 MiB block serves a 3.5 MiB request whole (the 0.5 MiB rest is too small to split):
    # the allocator's statistic may count 4 MiB; the bytes requested are 3.5 MiB.
    torch.cuda.empty_cache()
    a = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    del a
    with PeakWindow("cuda") as w:
        b = torch.empty(7 << 19, dtype=torch.uint8, device="cuda")
        del b
    assert w.requested_peak_bytes == 7 << 19
    assert w.peak_bytes >= w.requested_peak_bytes
