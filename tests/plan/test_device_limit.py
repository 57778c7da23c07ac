"""The device as the default limit (issue: fit the device by default): what a process can reserve
on its GPU, plans judged by what the caching allocator reserves, and the knee kept for the CPU and
for ``budget="knee"``."""
from __future__ import annotations

import pytest
import torch

from lightning_memplan.plan import Candidate
from lightning_memplan.planner import device_limit as dl
from lightning_memplan.planner.device_limit import CUDA_MARGIN_BYTES, DeviceLimit, device_limit, usable_bytes
from lightning_memplan.planner.search import PlanDoesNotFit, choose, held_bytes
from lightning_memplan.planner.settings import PlanSettings

MiB = 2**20
GiB = 2**30


def test_usable_bytes_is_free_plus_held_less_the_margin() -> None:
    assert usable_bytes(free=70 * GiB, held=3 * GiB, margin=512 * MiB) == 73 * GiB - 512 * MiB
    assert usable_bytes(free=100 * MiB, held=0, margin=512 * MiB) == 0  # never negative
    with pytest.raises(ValueError, match=r"`usable_bytes\(free=-1\)` must be a byte count >= 0"):
        usable_bytes(free=-1, held=0, margin=0)


def test_the_cpu_has_no_device_limit() -> None:
    assert device_limit("cpu") is None
    assert device_limit(torch.device("cpu"), processes=4) is None


def test_a_cuda_limit_reads_free_and_held_memory_and_adds_a_margin_for_several_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (60 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 5 * GiB)
    one = device_limit("cuda:1")
    assert one == DeviceLimit(bytes=65 * GiB - CUDA_MARGIN_BYTES, free_bytes=60 * GiB, held_bytes=5 * GiB,
                              margin_bytes=CUDA_MARGIN_BYTES, device="cuda:1")
    assert "cuda:1's memory: 60.00 GiB free + 5.00 GiB held by this process - 512.00 MiB margin" == one.source
    ddp = device_limit("cuda:1", processes=2)
    assert ddp is not None and ddp.margin_bytes == CUDA_MARGIN_BYTES + dl.COMMUNICATION_MARGIN_BYTES


def _limit(nbytes: int) -> DeviceLimit:
    return DeviceLimit(bytes=nbytes, free_bytes=nbytes, held_bytes=0, margin_bytes=0, device="cuda:0")


def test_only_auto_without_max_memory_takes_the_device_limit() -> None:
    auto = PlanSettings.from_args("MemPlanCallback")
    assert auto.wants_device_limit and auto.limit_source == ""
    fitted = auto.with_device_limit(_limit(8 * GiB))
    assert fitted.max_memory == 8 * GiB and fitted.limit_name.startswith("cuda:0's memory: ")
    assert auto.with_device_limit(None) is auto  # the CPU: the knee stays
    # an explicit argument never loses: a max_memory, a budget, or the knee asked for
    given = PlanSettings.from_args("MemPlanCallback", max_memory="1GiB")
    assert given.with_device_limit(_limit(8 * GiB)).max_memory == GiB and given.limit_name == "max_memory"
    assert PlanSettings.from_args("MemPlanCallback", budget=0.5).with_device_limit(_limit(GiB)).max_memory is None
    knee = PlanSettings.from_args("MemPlanCallback", budget="knee")
    assert knee.budget == "knee" and knee.with_device_limit(_limit(GiB)).max_memory is None


def test_a_bad_budget_names_both_words() -> None:
    with pytest.raises(ValueError, match=r"`plan_memory\(budget='knees'\)` is not valid\. Expected a float in "
                                         r"\[0\.0, 1\.0\], 'auto' .* or 'knee' .* Did you mean 'knee'\?"):
        PlanSettings.from_args("plan_memory", budget="knees")


def test_plans_are_judged_by_what_the_allocator_reserves() -> None:
    # budget 1.0 fits in allocated bytes (9 GiB) but its segments need 1.5 GiB more: over a 10 GiB device
    cands = [Candidate(budget=1.0, peak_bytes=8 * GiB, cost=1.0, reserve_bytes=int(1.5 * GiB)),
             Candidate(budget=0.5, peak_bytes=6 * GiB, cost=1.2, reserve_bytes=GiB)]
    assert held_bytes(cands[0], GiB) == int(10.5 * GiB)
    plan = choose(cands, baseline_bytes=GiB, max_memory=10 * GiB, solver="dp", limit_name="cuda:0's memory")
    assert plan.budget == 0.5 and plan.reason == "cheapest plan within 10.00 GiB (cuda:0's memory)"
    # where the allocator model did not run (CPU) the allocated total is what is judged
    plain = [Candidate(budget=c.budget, peak_bytes=c.peak_bytes, cost=c.cost) for c in cands]
    assert choose(plain, baseline_bytes=GiB, max_memory=10 * GiB, solver="dp").budget == 1.0


def test_the_fastest_plan_when_it_fits_the_device_and_a_clear_error_when_nothing_does() -> None:
    cands = [Candidate(budget=1.0, peak_bytes=4 * GiB, cost=1.0, reserve_bytes=0),
             Candidate(budget=0.3, peak_bytes=GiB, cost=1.3, reserve_bytes=0)]
    roomy = choose(cands, baseline_bytes=GiB, max_memory=70 * GiB, solver="dp", limit_name="cuda:0's memory")
    assert roomy.budget == 1.0 and not roomy.checkpoint  # no recompute when the unplanned step fits
    assert choose(cands, baseline_bytes=GiB, max_memory=None, solver="dp").budget == 0.3  # the knee, without a limit
    with pytest.raises(PlanDoesNotFit, match=r"no plan fits 1\.00 GiB \(cuda:0's memory\): the smallest forecast is "
                                             r"2\.00 GiB .* Reduce the batch"):
        choose(cands, baseline_bytes=GiB, max_memory=GiB, solver="dp", limit_name="cuda:0's memory")
