"""allocations: a step's allocation stream (stitching graphs, merging aliased inputs) and its CUDA allocator replay."""
from __future__ import annotations

import pytest

from lightning_memplan.forecasting.allocations import (
    AllocEvent,
    GraphTrace,
    RegionTrace,
    StepAllocations,
    accumulation_order,
    lightning_order,
    share_inputs,
    simulate_cuda_allocator,
    stitch_step,
)

MiB = 1 << 20


def a(key: object, n: int, device: str = "cpu") -> AllocEvent:
    return AllocEvent("alloc", key, n, device)


def f(key: object, n: int, device: str = "cpu") -> AllocEvent:
    return AllocEvent("free", key, n, device)


def ops(events: tuple[AllocEvent, ...]) -> list[tuple[str, int, int]]:
    return [(e.op, e.key, e.nbytes) for e in events]  # type: ignore[misc]


def running(events: tuple[AllocEvent, ...]) -> list[int]:
    cur, out = 0, []
    for e in events:
        cur += e.nbytes if e.op == "alloc" else -e.nbytes
        out.append(cur)
    return out


def test_one_region_saved_activation_loss_gradient_and_optimizer() -> None:
    fw = GraphTrace(events=(a("x", 100), a("s", 200), a("loss", 4), f("x", 100)))
    bw = GraphTrace(inputs=(a("s", 200), a("t", 4)), tangent_keys=frozenset({"t"}),
                    events=(a("g", 300), f("s", 200), f("t", 4)))
    step = stitch_step([RegionTrace(forward=fw, backward=bw)], [a("tmp", 50), f("tmp", 50)])
    events, span = step.events, step.optimizer_span
    assert ops(events) == [
        ("alloc", 0, 100), ("alloc", 1, 200), ("alloc", 2, 4), ("free", 0, 100),  # forward
        ("alloc", 3, 4),  # the loss's gradient: the last region's tangent, made by autograd
        ("alloc", 4, 300), ("free", 1, 200), ("free", 3, 4),  # backward frees the forward's saved block
        ("alloc", 5, 50), ("free", 5, 50),  # optimizer temporaries
        ("free", 4, 300),  # zero_grad
        ("free", 2, 4),  # the loss, at the end
    ]
    assert span == (8, 10) and step.backward_start == 4 and step.zero_grad_span == (10, 11)
    assert max(running(events)) == 508 and running(events)[-1] == 0
    assert step.requested_peak_bytes == 508


def _chain(tangent: int = 64) -> list[RegionTrace]:
    """Region 0's output ``o0`` feeds region 1; region 1's backward returns its gradient ``gin`` (64
    bytes) and its parameter's ``g1`` (16). Region 0's incoming gradient is ``tangent`` bytes: 64
    when region 1 consumed ``o0`` directly, else uncompiled code between them changed its size."""
    return [
        RegionTrace(forward=GraphTrace(events=(a("o0", 64), a("s0", 32))),
                    backward=GraphTrace(inputs=(a("s0", 32), a("t0", tangent)), tangent_keys=frozenset({"t0"}),
                                        events=(a("g0", 16), f("s0", 32), f("t0", tangent)))),
        RegionTrace(forward=GraphTrace(events=(a("s1", 32), a("loss", 4))),
                    backward=GraphTrace(inputs=(a("s1", 32), a("t1", 4)), tangent_keys=frozenset({"t1"}),
                                        events=(a("gin", 64), a("g1", 16), f("s1", 32), f("t1", 4))),
                    param_gradients=16),
    ]


def test_a_region_receives_the_gradient_the_next_backward_returned() -> None:
    step = stitch_step(_chain())
    events = step.events
    assert step.optimizer_span is None and step.zero_grad_span is None
    o0, s0, s1, loss, t1, gin, g1, g0 = 0, 1, 2, 3, 4, 5, 6, 7
    assert [k for op, k, n in ops(events) if op == "alloc"] == [o0, s0, s1, loss, t1, gin, g1, g0]
    assert ("alloc", 8, 64) not in ops(events)  # region 0's tangent is `gin`, not a new block
    order = ops(events)
    i_free_o0 = order.index(("free", o0, 64))
    assert order.index(("free", s1, 32)) < i_free_o0 < order.index(("alloc", g0, 16))  # o0 dies when bw 0 starts
    # freed at its last use inside the backward (inductor's wrapper deletes it there too)
    assert order.index(("free", s0, 32)) < order.index(("free", gin, 64)) < order.index(("free", loss, 4))
    assert running(events)[-1] == 0 and len(events) == 16


def test_a_gradient_that_uncompiled_code_consumed_dies_when_the_backward_starts() -> None:
    # region 1 returns 64 bytes; an eager module between the regions turns them into 128 bytes
    events = stitch_step(_chain(tangent=128)).events
    o0, t1, gin, t0 = 0, 4, 5, 7  # allocated in the order o0, s0, s1, loss, t1, gin, g1, t0, g0
    order = ops(events)
    assert ("alloc", t0, 128) in order  # the incoming gradient is a new block
    i_free_gin = order.index(("free", gin, 64))
    assert order.index(("free", t1, 4)) < i_free_gin < order.index(("alloc", t0, 128))
    # the timeline's rule: as backward 0 starts, its output o0 and the 64 handed bytes are replaced by
    # the 128-byte gradient; the parameter's gradient g1 stays (live after backward 1: o0, s0, loss,
    # gin, g1)
    i_t0 = order.index(("alloc", t0, 128))
    assert running(events)[i_t0] == (64 + 32 + 4 + 64 + 16) - 64 - 64 + 128
    assert order.index(("free", o0, 64)) < i_t0 and running(events)[-1] == 0
def test_outputs_the_eager_code_between_calls_dropped_are_freed_there() -> None:
    # region 0 (an embedding: nothing saved) returns e0 (64 B); the eager code after region 1's
    # forward drops it, as the timeline's forward_freed={1: {0: 64}} says
    emb = RegionTrace(forward=GraphTrace(events=(a("e0", 64),)),
                      backward=GraphTrace(inputs=(a("te", 64),), tangent_keys=frozenset({"te"}),
                                          events=(a("ge", 8), f("te", 64))), param_gradients=8)
    plain = stitch_step([emb, *_chain()]).events
    events = stitch_step([emb, *_chain()], forward_freed={1: {0: 64}}).events
    e0, s0 = 0, 2  # o0 (1) is region 1's input
    order = ops(events)
    assert order.index(("alloc", s0, 32)) < order.index(("free", e0, 64)) < order.index(("alloc", 3, 32))
    assert max(running(events)) == max(running(plain)) - 64
    assert order.count(("free", e0, 64)) == 1 and running(events)[-1] == 0


def test_saved_activation_matched_by_size_when_keys_differ() -> None:
    # inductor's forward and backward wrappers number their buffers independently
    fw = GraphTrace(events=(a(("fw", 1), 64), a(("fw", 2), 32), a(("fw", 3), 4)))
    bw = GraphTrace(inputs=(a(("bw", 1), 32),), events=(a(("bw", 2), 16), f(("bw", 1), 32)))
    events = stitch_step([RegionTrace(forward=fw, backward=bw)]).events
    assert ops(events)[:5] == [("alloc", 0, 64), ("alloc", 1, 32), ("alloc", 2, 4), ("alloc", 3, 16), ("free", 1, 32)]


def test_share_inputs_counts_views_of_one_storage_once_and_views_of_primals_never() -> None:
    # q, k, v: three views of one 30-byte qkv storage; x: a view of a primal; y: an intermediate
    events = [a(1, 10), a(2, 10), a(3, 10), a(4, 8), a("y", 5), f(1, 10), f(4, 8), f(2, 10), f("y", 5), f(3, 10)]
    out, marks, timeline = share_inputs(events, [4, 5, 10], {1: "qkv", 2: "qkv", 3: "qkv", 4: None}, {"qkv": 30})
    assert [(e.op, e.key, e.nbytes) for e in out] == [("alloc", 1, 30), ("alloc", "y", 5), ("free", "y", 5),
                                                     ("free", 1, 30)]
    assert marks == [1, 2, 4] and timeline == [30, 35, 0]


def test_simulate_counts_whole_blocks_and_skips_other_devices() -> None:
    # 11.5 MiB gets a 12 MiB segment (>= 10 MiB: rounded to 2 MiB); the 0.5 MiB rest is too small to
    # split off a large block, so the whole 12 MiB block is allocated
    n = 11 * MiB + MiB // 2
    step = StepAllocations(baseline=((1000, "cpu"),), events=(a("k", n, "cuda"), f("k", n, "cuda"),
                                                              a("c", 7, "cpu"), f("c", 7, "cpu")))
    sim = simulate_cuda_allocator(step)
    assert (sim.allocated_peak_bytes, sim.requested_peak_bytes, sim.reserved_peak_bytes) == (12 * MiB, n, 12 * MiB)
    assert sim.baseline_allocated_bytes == 0 and sim.allocated_max_bytes == 12 * MiB and sim.device == "cuda"
    cpu = simulate_cuda_allocator(step, device="cpu")
    assert cpu.baseline_allocated_bytes == 1024 and cpu.allocated_peak_bytes == 512  # 512-byte rounding


def test_simulate_creates_new_optimizer_state_inside_the_first_step() -> None:
    # A 6 MiB activation A at [0, 6) and a 2 MiB gradient G at [6, 8) MiB of one 20 MiB segment.
    # State created at the first optimizer step (A freed, G live) goes, by best fit, into the 12 MiB
    # free block at [8, 20): nothing more is reserved. State allocated before the first step (as if
    # it existed) gets its own 10 MiB segment, and A then needs a 20 MiB one: 30 MiB reserved.
    ev = (a("A", 6 * MiB, "cuda"), a("G", 2 * MiB, "cuda"), f("A", 6 * MiB, "cuda"),
          a("T", 4 * MiB, "cuda"), f("T", 4 * MiB, "cuda"), f("G", 2 * MiB, "cuda"))
    state = ((10 * MiB, "cuda"),)
    created = simulate_cuda_allocator(StepAllocations(baseline=(), events=ev, optimizer_span=(3, 5), new_state=state))
    existing = simulate_cuda_allocator(StepAllocations(baseline=state, events=ev, optimizer_span=(3, 5)))
    assert created.reserved_peak_bytes == 20 * MiB and existing.reserved_peak_bytes == 30 * MiB
    assert created.allocated_peak_bytes == existing.allocated_peak_bytes == 8 * MiB
    assert created.baseline_allocated_bytes == existing.baseline_allocated_bytes == 10 * MiB
    assert created.warmup_steps >= 2


def test_simulate_bad_argument() -> None:
    with pytest.raises(ValueError, match=r"`simulate_cuda_allocator\(max_warmup_steps=0\)` must be >= 1"):
        simulate_cuda_allocator(StepAllocations(baseline=(), events=()), max_warmup_steps=0)


def _adam_like_step(dev: str) -> tuple[RegionTrace, StepAllocations]:
    """One region (input x, saved s, loss; backward: gradient g) and an optimizer temporary."""
    fw = GraphTrace(events=(a("x", 100, dev), a("s", 200, dev), a("loss", 4, dev), f("x", 100, dev)))
    bw = GraphTrace(inputs=(a("s", 200, dev), a("t", 4, dev)), tangent_keys=frozenset({"t"}),
                    events=(a("g", 300, dev), f("s", 200, dev), f("t", 4, dev)))
    region = RegionTrace(forward=fw, backward=bw)
    return region, stitch_step([region], [a("tmp", 50, dev), f("tmp", 50, dev)])


def test_lightning_order_frees_the_previous_gradients_before_the_backward() -> None:
    region, step = _adam_like_step("cuda")
    lit = lightning_order(step)
    assert ops(lit.events) == [
        ("alloc", 0, 100), ("alloc", 1, 200), ("alloc", 2, 4), ("free", 0, 100),
        ("free", 4, 300),  # zero_grad: the previous step's gradient, before the backward
        ("alloc", 3, 4), ("alloc", 4, 300), ("free", 1, 200), ("free", 3, 4),
        ("alloc", 5, 50), ("free", 5, 50),
        ("free", 2, 4),  # the new gradient stays live
    ]
    assert (lit.backward_start, lit.zero_grad_span, lit.optimizer_span) == (5, (4, 5), (9, 11))
    assert lightning_order(stitch_step([region])).events == stitch_step([region]).events  # no optimizer: nothing to move
    sim = simulate_cuda_allocator(lit)
    # every block rounds to 512 bytes; the gradient's block is live when the measured step starts
    assert sim.baseline_allocated_bytes == 512
    assert (sim.requested_peak_bytes, sim.allocated_peak_bytes) == (304, 3 * 512)


def test_accumulation_order_frees_the_new_gradients_after_the_backward_and_keeps_the_accumulated() -> None:
    region, step = _adam_like_step("cuda")
    acc = accumulation_order(step)
    assert acc.baseline == ((300, "cuda"),)  # the accumulated gradient, live all along
    assert ops(acc.events) == [
        ("alloc", 0, 100), ("alloc", 1, 200), ("alloc", 2, 4), ("free", 0, 100),
        ("alloc", 3, 4), ("alloc", 4, 300), ("free", 1, 200), ("free", 3, 4),
        ("free", 4, 300),  # added into the accumulated gradient, then freed: before the optimizer
        ("alloc", 5, 50), ("free", 5, 50),
        ("free", 2, 4),
    ]
    assert (acc.zero_grad_span, acc.optimizer_span) == ((8, 9), (9, 11))
    assert acc.requested_peak_bytes == step.requested_peak_bytes == 508  # the backward's peak stands
    sim = simulate_cuda_allocator(acc)
    assert sim.baseline_allocated_bytes == 512  # the accumulated gradient's block
    assert (sim.requested_peak_bytes, sim.allocated_peak_bytes) == (508, 4 * 512)  # s, loss, t, g
    assert accumulation_order(stitch_step([region])).events == stitch_step([region]).events  # no optimizer: nothing to move


def test_what_the_eager_code_made_before_a_region_lives_until_that_regions_backward_has_run() -> None:
    # the eager code before region 1's forward made 48 B autograd holds (region 1's input computed
    # eagerly, a dropout mask): allocated before that forward, freed after its backward
    plain = stitch_step(_chain()).events
    events = stitch_step(_chain(), fresh=(0, 48)).events
    order = ops(events)
    glue = next(k for op, k, n in order if op == "alloc" and n == 48)
    s1 = order[order.index(("alloc", glue, 48)) + 1][1]
    assert order[order.index(("alloc", glue, 48)) + 1] == ("alloc", s1, 32)  # region 1's first allocation
    g1 = next(k for op, k, n in order if op == "alloc" and n == 16 and k > s1 + 2)
    # freed once region 1's backward has made its gradients, before region 0's backward allocates
    assert order.index(("alloc", g1, 16)) < order.index(("free", glue, 48)) < len(order) - 1
    g0_alloc = max(i for i, (op, k, n) in enumerate(order) if op == "alloc" and n == 16)
    assert order.index(("free", glue, 48)) < g0_alloc
    assert max(running(events)) == max(running(plain)) + 48 and running(events)[-1] == 0
