"""The step's layout (forecasting.layout): the peak tracker, and small timelines computed by hand."""
from __future__ import annotations

import dataclasses

from lightning_memplan.forecasting.eager_loss import EagerLoss
from lightning_memplan.forecasting.layout import (
    PeakTracker,
    StepParts,
    lay_out,
    lay_out_calls,
    run_order,
)
from lightning_memplan.forecasting.optim_memory import OptimizerMemory
from lightning_memplan.forecasting.regions import RegionPlan


def _plan(index: int, *, fw: tuple[int, ...], retained: int, saved: int, bw: tuple[int, ...], bw_end: int,
          gradients: int, grads_at_peak: int = 0, input_last_use: int | None = None) -> RegionPlan:
    return RegionPlan(index=index, method="fx", fw_nodes=tuple(f"f{k}" for k in range(len(fw))), fw_timeline=fw,
                      fw_retained=retained, saved=saved, bw_nodes=tuple(f"b{k}" for k in range(len(bw))),
                      bw_timeline=bw, bw_end=bw_end, bw_peak=max(bw), bw_grads_at_peak=grads_at_peak,
                      gradients=gradients, tangents=0, tangents_in_timeline=True, grad_copy=0,
                      param_gradients=gradients, input_last_use=input_last_use)


def test_the_tracker_starts_at_zero_and_ignores_totals_not_above_it() -> None:
    t = PeakTracker()
    assert (t.peak, t.at_peak) == (0, (0, 0, 0, 0))
    t.see(0, gradients=0, fsdp=0)
    t.see(-5, gradients=0, fsdp=0)
    assert (t.peak, t.at_peak) == (0, (0, 0, 0, 0))


def test_the_tracker_keeps_the_split_at_the_peak_whatever_is_released_after_it() -> None:
    t = PeakTracker()
    t.see(100, gradients=30, fsdp=10)
    assert (t.peak, t.at_peak) == (100, (60, 30, 0, 10))
    t.see(80, gradients=80, fsdp=0)  # lower: the gradients came after activations were released
    t.see(100, gradients=100, fsdp=0)  # a tie keeps the first split
    assert (t.peak, t.at_peak) == (100, (60, 30, 0, 10))
    t.see(150, gradients=20, fsdp=0, temporaries=50)
    assert (t.peak, t.at_peak) == (150, (80, 20, 50, 0))
    assert sum(t.at_peak) == t.peak


def test_a_peak_inside_a_regions_forward_is_counted() -> None:
    # the forward peaks at 700 B inside the region and leaves 300 B (200 B saved, 100 B of output);
    # the backward starts above the output (100 B) and peaks at 100 + 450
    p = _plan(0, fw=(100, 700, 300), retained=300, saved=200, bw=(200, 450), bw_end=150, gradients=150)
    timeline, peak, at_peak = lay_out([p], None)
    assert [(t.phase, t.node, t.bytes) for t in timeline] == [
        ("forward", "f0", 100), ("forward", "f1", 700), ("forward", "f2", 300),
        ("backward", "b0", 300), ("backward", "b1", 550)]
    assert (peak, at_peak) == (700, (700, 0, 0, 0))


def test_the_optimizer_steps_on_top_of_the_gradients() -> None:
    p = _plan(0, fw=(100, 700, 300), retained=300, saved=200, bw=(200, 450), bw_end=150, gradients=150)
    opt = OptimizerMemory(state_bytes=0, step_peak_bytes=600, state_source="simulated")
    timeline, peak, at_peak = lay_out([p], opt)
    # after the backward: the output (100 B) and the gradients (150 B); the step adds 600 B
    assert [(t.node, t.bytes) for t in timeline[-2:]] == [("step", 850), ("zero_grad", 100)]
    assert (peak, at_peak) == (850, (100, 150, 600, 0))


def _chain() -> list[RegionPlan]:
    # region 0 leaves 50 B: 30 B saved, 20 B of outputs that region 1 reads; region 1 leaves 40 B:
    # 30 B saved, 10 B of output (the loss)
    return [_plan(0, fw=(50,), retained=50, saved=30, bw=(30, 80, 10), bw_end=10, gradients=10),
            _plan(1, fw=(100, 40), retained=40, saved=30, bw=(30, 130, 20), bw_end=20, gradients=20,
                  grads_at_peak=20, input_last_use=0)]


def test_backwards_release_in_reverse_and_each_regions_outputs_die_at_its_own_backward() -> None:
    timeline, peak, at_peak = lay_out(_chain(), None)
    assert [(t.phase, t.region, t.bytes) for t in timeline] == [
        ("forward", 0, 50), ("forward", 1, 150), ("forward", 1, 90),
        # region 1's backward starts at 90 - 30 = 60: region 0's 20 B of outputs are still live
        ("backward", 1, 90), ("backward", 1, 190), ("backward", 1, 80),
        # then region 0's, at 80 - 30 (its saved) - 20 (its outputs, released now) = 30
        ("backward", 0, 60), ("backward", 0, 110), ("backward", 0, 40)]
    assert (peak, at_peak) == (190, (170, 20, 0, 0))


def test_outputs_a_later_backward_held_last_are_released_after_its_last_read() -> None:
    # region 1's backward reads region 0's outputs last at its step 0: they die before its peak
    timeline, peak, at_peak = lay_out(_chain(), None, early={1: {0: 20}})
    assert [t.bytes for t in timeline if t.phase == "backward"] == [90, 170, 60, 60, 110, 40]
    assert (peak, at_peak) == (170, (150, 20, 0, 0))


def test_outputs_the_eager_code_dropped_die_after_it_not_at_their_regions_backward() -> None:
    # 15 of region 0's 20 B of outputs went straight to the eager code after the call (a KV cache
    # beside the logits region 1 reads), which dropped them: freed there, not at region 0's backward
    timeline, peak, _ = lay_out(_chain(), None, eager_freed={1: [(0, 15)]})
    assert [(t.phase, t.region, t.node, t.bytes) for t in timeline] == [
        ("forward", 0, "f0", 50), ("forward", 1, "f0", 150), ("forward", 1, "f1", 90),
        ("forward", 1, "eager_outputs_freed", 75),
        # region 1's backward starts 15 B lower than without (60): 75 - 30
        ("backward", 1, "b0", 75), ("backward", 1, "b1", 175), ("backward", 1, "b2", 65),
        # region 0's at 65 - 30 (its saved) - 5 (its outputs left): where it started without
        ("backward", 0, "b0", 60), ("backward", 0, "b1", 110), ("backward", 0, "b2", 40)]
    assert peak == 175


def test_outputs_the_eager_code_dropped_after_the_next_forward_dropped_them_live_through_it() -> None:
    # region 1 keeps none of its inputs: region 0's outputs die when region 1's forward has run
    # (90 - 20 = 70); the 15 B handed to the eager code live there again until it drops them
    plans = _chain()
    plans[1] = dataclasses.replace(plans[1], keeps_inputs=False)
    overlay = {("fw", 1, "after"): [("eager", "activations", 5), ("eager_end", "activations", -5)]}
    timeline, _, _ = lay_out(plans, None, overlay=overlay, eager_freed={1: [(0, 15)]})
    assert [(t.node, t.bytes) for t in timeline[2:6]] == [
        ("f1", 90), ("eager", 90), ("eager_end", 85), ("eager_outputs_freed", 70)]
    assert timeline[6].bytes == 70 - 30 + 30  # region 1's backward starts where it would have


def _three() -> list[RegionPlan]:
    # region 0 (an embedding) leaves 20 B of output, nothing saved; regions 1 and 2 as _chain's
    c = _chain()
    return [_plan(0, fw=(20,), retained=20, saved=0, bw=(0, 5), bw_end=5, gradients=5),
            dataclasses.replace(c[0], index=1), dataclasses.replace(c[1], index=2)]


def test_outputs_the_eager_code_between_calls_dropped_die_there() -> None:
    # the eager code after region 1's forward dropped region 0's 20 B (a sum of two embeddings in
    # the frame that loops over blocks compiled on their own): freed there, not at region 0's backward
    _, before, _ = lay_out(_three(), None)
    timeline, peak, _ = lay_out(_three(), None, forward_freed={1: {0: 20}})
    assert [(t.phase, t.region, t.node, t.bytes) for t in timeline] == [
        ("forward", 0, "f0", 20), ("forward", 1, "f0", 70), ("forward", 1, "outputs_freed", 50),
        # everything after is 20 B lower (110, 210, ... without) up to region 0's backward
        ("forward", 2, "f0", 150), ("forward", 2, "f1", 90),
        ("backward", 2, "b0", 90), ("backward", 2, "b1", 190), ("backward", 2, "b2", 80),
        ("backward", 1, "b0", 60), ("backward", 1, "b1", 110), ("backward", 1, "b2", 40),
        # which starts where it did: its outputs are not released twice
        ("backward", 0, "b0", 40), ("backward", 0, "b1", 45)]
    assert (before, peak) == (210, 190)


def test_one_call_laid_out_from_its_parts_is_the_plain_layout() -> None:
    plans = _chain()
    parts = StepParts(plans=tuple(reversed(plans)), executions=(0, 1), early={1: {0: 20}})
    assert [p.index for p in run_order(parts.plans, parts.executions)] == [0, 1]
    assert lay_out_calls([parts]) == lay_out(plans, None, early={1: {0: 20}})



def test_each_incoming_gradient_dies_at_a_reader_of_its_own_view() -> None:
    """Four cached keys/values of one size share one merged view with four readers, one each; the
    logits' gradient has a view of its own; a size with no view lives to the last tangent read."""
    from lightning_memplan.forecasting.eager_loss import EagerLoss
    from lightning_memplan.forecasting.layout import incoming_gradient_lifetimes

    loss = EagerLoss(outputs_bytes=0, outputs_kept_bytes=0, kept_bytes=0, backward_peak_bytes=0,
                     output_grad_bytes=300, output_grad_sizes=(300,), zero_grad_bytes=4 * 10 + 7,
                     zero_grad_sizes=(10, 10, 10, 10, 7))
    lives, rest = incoming_gradient_lifetimes([(10, (5, 2, 40, 41)), (300, (3,))], loss)
    assert sorted(lives) == [(10, 2), (10, 5), (10, 40), (10, 41), (300, 3)] and rest == 7
    unknown = EagerLoss(outputs_bytes=0, outputs_kept_bytes=0, kept_bytes=0, backward_peak_bytes=0,
                        output_grad_bytes=300, zero_grad_bytes=20)  # sizes not known apart
    assert incoming_gradient_lifetimes([(10, (5,)), (300, (3,))], unknown) == ([], 320)


def test_a_call_laid_out_in_another_number_of_regions_counts_the_dropped_outputs_as_outputs() -> None:
    # the eager code got 15 B straight from the first of the call's 2 regions and dropped them
    parts = StepParts(plans=tuple(_chain()), executions=(0, 1))
    loss = EagerLoss(outputs_bytes=10, outputs_kept_bytes=0, kept_bytes=0, backward_peak_bytes=0,
                     output_grad_bytes=0, early_outputs=((0, 15),), regions=2)
    timeline, _, _ = lay_out_calls([parts], losses=[loss])
    assert [(t.node, t.bytes) for t in timeline[2:6]] == [
        ("f1", 90), ("eager_loss_forward", 100), ("eager_forward_freed", 90), ("eager_outputs_freed", 75)]
    # forecast in 3 regions, the place "first region" names another: the 15 B are outputs of the call
    other = dataclasses.replace(loss, regions=3)
    timeline, _, _ = lay_out_calls([parts], losses=[other])
    assert [(t.node, t.bytes) for t in timeline[2:5]] == [
        ("f1", 90), ("eager_loss_forward", 115), ("eager_forward_freed", 90)]
    assert other.with_early_outputs_counted() == dataclasses.replace(other, outputs_bytes=25, early_outputs=())


def test_a_stand_in_loss_compiled_on_its_own_leaves_the_outputs_counted_once() -> None:
    # the head (its 80 B of logits returned) and, after a graph break, the forecast's stand-in loss
    # as a region of its own: one more than the measured call ran (regions=1). The logits are the
    # head's outputs; the eager loss keeps 5 B and drops them, so they are not counted again
    head = _plan(0, fw=(100,), retained=100, saved=20, bw=(20, 30), bw_end=10, gradients=10)
    stand_in = dataclasses.replace(_plan(1, fw=(4,), retained=4, saved=0, bw=(0,), bw_end=0, gradients=0),
                                   param_gradients=0)
    loss = EagerLoss(outputs_bytes=80, outputs_kept_bytes=0, kept_bytes=5, backward_peak_bytes=85,
                     output_grad_bytes=80, regions=1)
    parts = StepParts(plans=(head, stand_in), executions=(0, 1))
    timeline, _, _ = lay_out_calls([parts], losses=[loss])
    assert [(t.node, t.bytes) for t in timeline if t.phase == "forward"] == [
        ("f0", 100), ("f0", 104), ("eager_loss_forward", 104 + 5), ("eager_outputs_freed", 104 + 5 - 80)]
    # a call laid out in some other number of regions still counts the outputs as the call's
    timeline, _, _ = lay_out_calls([parts], losses=[dataclasses.replace(loss, regions=3)])
    assert ("eager_loss_forward", 104 + 80 + 5) in [(t.node, t.bytes) for t in timeline]
    # so does a last region that saves something: no stand-in
    saves = dataclasses.replace(stand_in, saved=4)
    timeline, _, _ = lay_out_calls([StepParts(plans=(head, saves), executions=(0, 1))], losses=[loss])
    assert ("eager_loss_forward", 104 + 80 + 5) in [(t.node, t.bytes) for t in timeline]



def test_what_the_eager_code_made_before_each_region_is_laid_out_with_each_call() -> None:
    # StepParts.glue (bytes the eager code made before each region's forward, held by autograd) are
    # laid out as that position's fresh inputs, in every call of the model
    plans = _chain()
    parts = StepParts(plans=tuple(plans), executions=(0, 1), glue=(0, 10))
    one = lay_out_calls([parts])
    assert one == lay_out(plans, None, inputs=(0, 10))
    assert one[1] == lay_out(plans, None)[1] + 10
    two = lay_out_calls([parts, parts], extra=(0,))
    assert two == lay_out([*plans, *plans], None, ends=frozenset({1, 3}), inputs=(0, 10, 0, 10),
                          accumulate=[p.param_gradients for p in plans] + [0, 0])
