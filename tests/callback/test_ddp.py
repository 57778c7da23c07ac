"""DDP, FSDP2 and tensor parallelism on CPU with 2 real processes (gloo): one plan on both ranks."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def _two_ranks(script: str, tmp_path: Path, timeout: int, *args: str) -> list[dict[str, Any]]:
    """Run ``script`` (2 gloo processes under Lightning) and return what each rank wrote; both
    ranks trained planned, with one budget."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name(script)), str(tmp_path), *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    # a rank that dies first shows its error near the start; the other's "connection closed" ends it
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "error:" in line]
    assert proc.returncode == 0, "\n".join(["first errors:", *errors[:12], "end of stderr:", proc.stderr[-3000:]])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["fallback"] is None and ranks[1]["fallback"] is None
    assert ranks[0]["budget"] == ranks[1]["budget"]
    return ranks


def test_ddp_two_processes_share_one_plan(tmp_path: Path) -> None:
    """training_step calls ``self.model(x)`` and no ``submodule=`` is given: under DDP (the
    LightningModule wrapped in DistributedDataParallel) both ranks find and plan ``model``."""
    ranks = _two_ranks("ddp_script.py", tmp_path, timeout=600)
    assert all(r["module"].startswith("`model` (TinyNet): the first module") for r in ranks), ranks
    # rank 0 searched; rank 1 received the same plan, candidates included
    assert ranks[0]["candidates"] == ranks[1]["candidates"] == 3  # two budgets and one remat plan
    assert all(r["measured"] and r["measured"][0] for r in ranks)
    rows = list(csv.DictReader(open(Path(ranks[0]["log_dir"]) / "metrics.csv")))
    logged = [float(r["memplan/measured_peak_bytes"]) for r in rows if r.get("memplan/measured_peak_bytes")]
    # the logged value is the max over ranks
    assert logged == [max(max(r["measured"][0]) for r in ranks)]


def test_ddp_ranks_that_run_other_input_shapes_log_the_largest_forecast(tmp_path: Path) -> None:
    """Batches of varying rows, split over the ranks by DistributedSampler: each rank forecasts the
    shapes it ran, and the logged prediction is the largest over the ranks, as the measurement is."""
    ranks = _two_ranks("ddp_script.py", tmp_path, 600, "varying")
    rows = [r["rows"][0] for r in ranks]
    # rank 0 plans at 64 rows and measures 96 and 64; rank 1 plans at 128 and measures 192 and 128 (the
    # first batch of new shapes measures the loss at them, the next warms the profiler up)
    assert [sorted(set(r)) for r in rows] == [[64, 96], [128, 192]], rows
    forecasts = [f for r in ranks for f in r["forecasts"][0]]
    assert None not in forecasts and len(set(forecasts)) > 2  # shapes other than each rank's planned ones
    # each measured batch against the forecast at its own shapes, on its own rank
    pairs = [(m, f) for r in ranks for m, f in zip(r["measured"][0], r["forecasts"][0])]
    assert all(abs(f - m) / m < 0.01 for m, f in pairs), pairs
    logged = list(csv.DictReader(open(Path(ranks[0]["log_dir"]) / "metrics.csv")))
    [row] = [r for r in logged if r.get("memplan/predicted_peak_bytes")]
    assert float(row["memplan/predicted_peak_bytes"]) == max(forecasts)  # the largest over both ranks
    assert max(ranks[1]["forecasts"][0]) > max([*ranks[0]["forecasts"][0], ranks[0]["planned"]])  # rank 1's
    assert float(row["memplan/measured_peak_bytes"]) == max(m for m, _ in pairs)
    assert abs(float(row["memplan/prediction_error"])) < 0.01, row


def test_ddp_ranks_compile_the_blocks_each_on_its_own_with_one_regional_plan(tmp_path: Path) -> None:
    """``regional=True`` and the default search under DDP: rank 0 searches the regional candidates,
    both ranks install the same plan (the blocks of the module training_step calls, and the head
    beside them, compiled each on its own), and each rank's measured peak is its forecast."""
    ranks = _two_ranks("ddp_script.py", tmp_path, 600, "regional")
    names = [f"blocks.{i}" for i in range(4)]
    assert ranks[0]["regional"] == ranks[1]["regional"] and set(names) <= set(ranks[0]["regional"]), ranks
    assert ranks[0]["candidates"] == ranks[1]["candidates"] > 2
    for r in ranks:
        assert r["measured"] and r["measured"][0], r
        assert all(abs(m - r["planned"]) / m < 0.01 for m in r["measured"][0]), (r["measured"], r["planned"])


def test_fsdp2_two_processes_decide_in_lockstep_and_count_local_shards(tmp_path: Path) -> None:
    """FSDP2 (``fully_shard`` under Lightning's ModelParallelStrategy): the forward all-gathers, so the
    candidates' forecasts must run on every rank (rank 0 alone hung in its first all-gather). FSDP's
    own buffers (all-gathered parameters, reduce-scatter inputs, gloo's copies) are forecast: without
    them the prediction was 71% low. The model's loss is a cross-entropy over 4,000 classes in
    training_step: the eager code after the forward is measured under FSDP2 too (with FSDP's
    pre-backward hooks inert during the partial backward); without it the prediction was 84% low.
    The blocks are torch's ``nn.TransformerEncoderLayer`` and the forward calls them in a loop: FSDP's
    hooks break the graph there, dynamo skips the forward's frame and never starts at a frame of
    torch's own classes, so nothing was compiled until the callback compiled each unit on its own."""
    ranks = _two_ranks("fsdp_script.py", tmp_path, timeout=300)
    assert ranks[0]["candidates"] == ranks[1]["candidates"] == 3
    assert all(r["measured"] and r["measured"][0] for r in ranks)
    # both ranks measured the eager end of the step and trained on after it: from the last compiled
    # block's outputs (dynamo skipped the forward's frame, so the head runs eagerly after it), the
    # head's 2 MB of logits, the log-softmax cross-entropy keeps
    for r in ranks:
        [m] = r["eager_losses"]
        assert m["outputs_bytes"] == 128 * 32 * 4 and m["kept_bytes"] >= 128 * 4000 * 4, m
    # the baseline counts this rank's padded shards (DTensor.to_local), as they are between steps,
    # also the root unit's own (the 4,000-class head), which the forecast saw unsharded inside the
    # forward; so do the gradients zero_grad frees before the backward (they were counted unsharded:
    # the prediction was 3.8% low)
    assert ranks[0]["parameters"] == ranks[0]["local_parameter_bytes"] < 0.6 * ranks[0]["full_parameter_bytes"]
    print(f"\nFSDP2 2 ranks budget {ranks[0]['budget']}: predicted {ranks[0]['predicted']} B "
          f"(FSDP buffers {ranks[0]['fsdp_buffers']} B), measured {[r['measured'] for r in ranks]} B")
    assert not ranks[0]["warnings"], ranks[0]["warnings"]  # nothing left out to warn about
    assert ranks[0]["fsdp_buffers"] > 0
    assert [float(v) for v in ranks[0]["logged_fsdp_buffers"]] == [ranks[0]["fsdp_buffers"]]  # one epoch
    # gloo frees its copy of a unit's buffers on its own thread, sometimes late: a window can then
    # see one or two more units live, or (the copy allocated in the window before) one freed; the
    # forecast is the step without them: some window measures it, and every window lies in that band
    predicted, unit = ranks[0]["predicted"], ranks[0]["largest_unit_bytes"]
    peaks = [p for r in ranks for p in r["measured"][0]]
    assert len(peaks) >= 6 and any(abs(p - predicted) <= 0.03 * p for p in peaks), (predicted, peaks)
    # at most one late copy per all-gather of the step's 4 units (2.26 largest units were seen once,
    # in a full suite run)
    assert all(predicted - 0.5 * unit <= p <= predicted + 4.2 * unit for p in peaks), (predicted, unit, peaks)


def test_fsdp2_plans_the_module_training_step_calls(tmp_path: Path) -> None:
    """FSDP2 in the common layout: the network is ``self.model`` (its blocks, itself and the
    LightningModule FSDP2 units), training_step calls ``self.model(x)``, no ``submodule=``: both
    ranks find that module on the first batch, plan it and forecast its step."""
    ranks = _two_ranks("fsdp_script.py", tmp_path, 300, "child")
    assert all(r["module"].startswith("`model` (FSDPSequential): the first module") for r in ranks), ranks
    assert not ranks[0]["warnings"], ranks[0]["warnings"]
    # the same band as above: gloo's late frees of its copies move single windows by whole units
    predicted, unit = ranks[0]["predicted"], ranks[0]["largest_unit_bytes"]
    peaks = [p for r in ranks for p in r["measured"][0]]
    assert any(abs(p - predicted) <= 0.03 * p for p in peaks), (predicted, peaks)
    assert all(predicted - 0.5 * unit <= p <= predicted + 4.2 * unit for p in peaks), (predicted, unit, peaks)


def test_fsdp2_with_regional_compiles_the_head_beside_the_units_and_counts_its_logits_once(tmp_path: Path) -> None:
    """FSDP2 in the common layout with ``regional=True``: the blocks are FSDP2 units (compiled each on
    its own already) and the head beside them compiles on its own too, so the forecast's stand-in
    loss is a region of its own after it. The 2 MB of logits are that head's outputs in the forecast,
    not counted again with the eager cross-entropy (the prediction was 30.9% high)."""
    ranks = _two_ranks("fsdp_script.py", tmp_path, 300, "regional")
    assert ranks[0]["regional"] == ranks[1]["regional"] == ["0", "1", "2", "3"], ranks  # 3 units, the head
    assert not ranks[0]["warnings"], ranks[0]["warnings"]
    predicted, unit = ranks[0]["predicted"], ranks[0]["largest_unit_bytes"]
    peaks = [p for r in ranks for p in r["measured"][0]]
    assert any(abs(p - predicted) <= 0.03 * p for p in peaks), (predicted, peaks)
    assert all(predicted - 0.5 * unit <= p <= predicted + 4.2 * unit for p in peaks), (predicted, unit, peaks)


def test_tensor_parallel_two_processes_compile_plan_and_measure_the_loss(tmp_path: Path) -> None:
    """Tensor parallelism alone (``parallelize_module``, 2 gloo ranks): the compiled graphs carry
    the process group as a script object, which torch's partitioner refused to size under a budget
    below 1 (the compile failed and the run fell back uncompiled); it is a handle, counted as zero
    bytes. The loss on the outputs is measured as without sharding (every rank at the same point),
    and the prediction holds (without it: -61% on a 4,000-vocabulary language model)."""
    ranks = _two_ranks("tp_script.py", tmp_path, timeout=300)
    assert all(r["eager_losses"] == 1 and not r["warnings"] for r in ranks), ranks
    predicted = ranks[0]["predicted"]
    peaks = [p for r in ranks for p in r["measured"][0]]
    print(f"\nTP 2 ranks budget {ranks[0]['budget']}: predicted {predicted} B, measured {peaks} B")
    assert len(peaks) == 4 and all(abs(p - predicted) <= 0.02 * p for p in peaks), (predicted, peaks)
