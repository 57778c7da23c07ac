"""Forecast vs measured peak of one FSDP2 training step, 2 processes (gloo on CPU).

Each rank shards residual MLP blocks with ``fully_shard`` (and the root), forecasts one AdamW step with
``lightning_memplan.forecast`` and measures it with ``measure_peak`` after two warm-up steps (rank 0's
figures). The named peer is the same forecast without FSDP's buffers (what it predicted before they
were modelled: the compiled graphs' activations and gradients over the local shards).

gloo frees its copy of a unit's buffers on its own thread, sometimes late, so a measured step can hold
one unit more, or less (a copy of the step before freed in it): the table shows the most frequent
of 5 measurements and their range.

FSDP's hooks break the graph at every unit, and dynamo skips a frame with a graph break inside a loop
(``Net.forward``'s loop over the blocks): the forecast compiles each unit's forward on its own
(``lightning_memplan.forecasting.unit_compile``; dynamo alone would not compile torch's own
``nn.TransformerEncoderLayer`` there) and the head runs uncompiled. The forecast then counts the
root's gradients but not the head's activations (small here: the "big head" rows have a 256 x 256
head, whose parameters stay unsharded all step).

    python benchmarks/fsdp.py                     # CPU, gloo, both backends (7 models x 2 budgets)
    python benchmarks/fsdp.py --backends aot_eager
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 2**20
#: (name, width, hidden widths of the blocks, head width, batch, mixed precision: (param, reduce) dtype,
#: block class: "mlp" (Block below) or "torch" (nn.TransformerEncoderLayer over the batch's rows as one
#: unbatched sequence, 4 heads))
MODELS = (
    ("3 blocks 256/512", 256, (512, 512, 512), 1, 64, None, "mlp"),
    ("4 blocks 256/512", 256, (512, 512, 512, 512), 1, 64, None, "mlp"),
    ("3 blocks, sizes differ", 256, (256, 512, 768), 1, 64, None, "mlp"),
    ("3 blocks, big head", 256, (512, 512, 512), 256, 64, None, "mlp"),
    ("3 blocks, big batch", 256, (512, 512, 512), 1, 1024, None, "mlp"),
    ("3 blocks, bf16 / fp32 reduce", 256, (512, 512, 512), 1, 64, (torch.bfloat16, torch.float32), "mlp"),
    ("3 blocks, bf16 / bf16 reduce", 256, (512, 512, 512), 1, 64, (torch.bfloat16, None), "mlp"),
    ("3 nn.TransformerEncoderLayer", 256, (512, 512, 512), 1, 256, None, "torch"),
)
BUDGETS = (1.0, 0.3)


class Block(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, width: int, hiddens: tuple[int, ...], head: int, kind: str = "mlp") -> None:
        super().__init__()
        self.blocks = nn.ModuleList([
            Block(width, h) if kind == "mlp" else nn.TransformerEncoderLayer(width, 4, h, dropout=0.0, batch_first=True)
            for h in hiddens])
        self.head = nn.Linear(width, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _without_fsdp(fc: object) -> int:
    """The forecast's peak laid out without FSDP's buffers (the peer)."""
    from lightning_memplan.forecasting.layout import lay_out, run_order

    parts = fc._parts  # type: ignore[attr-defined]
    return lay_out(run_order(parts.plans, parts.executions), parts.optimizer)[1]


def _rank(rank: int, world: int, models: list[str], backends: list[str], port: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from lightning_memplan import forecast, measure_peak

    mesh = init_device_mesh("cpu", (world,))
    rows = []
    for name, width, hiddens, head, batch, mixed, kind in (m for m in MODELS if m[0] in models):
        policy = {} if mixed is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=mixed[0],
                                                                             reduce_dtype=mixed[1])}
        for backend in backends:
            for budget in BUDGETS:
                torch.manual_seed(0)
                net = Net(width, hiddens, head, kind)
                for b in net.blocks:
                    fully_shard(b, mesh=mesh, **policy)
                fully_shard(net, mesh=mesh, **policy)
                opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
                x = torch.randn(batch, width)
                fc = forecast(net, (x,), budget=budget, backend=backend, optimizer=opt,
                              loss_fn=lambda y: y.pow(2).mean())
                for _ in range(2):
                    fc.step()
                peaks = [measure_peak(fc.step) for _ in range(5)]
                typical = Counter(peaks).most_common(1)[0][0]
                rows.append((name, backend, budget, fc.peak_bytes, fc.breakdown.fsdp_buffers, _without_fsdp(fc),
                             typical, min(peaks), max(peaks)))
                torch._dynamo.reset()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["aot_eager", "inductor"], choices=["aot_eager", "inductor"])
    parser.add_argument("--models", nargs="+", default=[m[0] for m in MODELS], choices=[m[0] for m in MODELS])
    parser.add_argument("--port", default="29611")
    args = parser.parse_args()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"memplan_fsdp_bench_{os.getpid()}.txt"
    mp.spawn(_rank, args=(2, args.models, args.backends, args.port, str(out)), nprocs=2)
    rows = json.loads(out.read_text())
    out.unlink()
    from tabulate import tabulate

    table = []
    errors = []
    for name, backend, budget, pred, fsdp, peer, typical, lo, hi in rows:
        err, peer_err = (pred - typical) / typical, (peer - typical) / typical
        errors.append(err)
        table.append([name, backend, budget, f"{pred / MiB:.2f}", f"{fsdp / MiB:.2f}", f"{typical / MiB:.2f}",
                      f"{lo / MiB:.2f}-{hi / MiB:.2f}", f"{err:+.1%}", f"{peer / MiB:.2f}", f"{peer_err:+.1%}"])
    print(f"torch {torch.__version__}, 2 processes, gloo on CPU; rank 0; peak of one AdamW step above the bytes "
          "live before it")
    print(tabulate(table, headers=["model", "backend", "budget", "predicted MiB", "of it FSDP MiB", "measured MiB",
                                   "measured range", "error", "peer: without FSDP MiB", "peer error"],
                   tablefmt="github"))
    print(f"\nrows: {len(rows)}; max |error| {max(abs(e) for e in errors):.2%}; "
          f"within 3%: {sum(abs(e) <= 0.03 for e in errors)}/{len(rows)}")


if __name__ == "__main__":
    main()
