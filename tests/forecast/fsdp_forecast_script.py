"""Run by test_fsdp_memory.py as a script: ``forecast()`` of an FSDP2 model in plain PyTorch, 2 gloo
processes. Each rank writes its forecast and 8 measured steps to OUT_DIR/rank{r}.json."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Net(nn.Module):
    """Three FSDP units and a root whose head (a square Linear) holds a unit's worth of parameters."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(3)])
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def run(rank: int, out_dir: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from lightning_memplan import forecast, measure_peak
    from lightning_memplan._compat import fsdp2_units

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    net = Net(128)
    for b in net.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    # before the first forward: FSDP has not decided which unit is the root yet
    fc = forecast(net, (torch.randn(64, 128),), budget=1.0, backend="aot_eager", optimizer=opt,
                  loss_fn=lambda y: y.pow(2).mean())
    for _ in range(2):
        fc.step()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "predicted": fc.peak_bytes, "fsdp_buffers": fc.breakdown.fsdp_buffers, "status": fc.status,
        "backward_graphs": sum(r._graphs[1] is not None for r in fc.regions),
        "measured": [measure_peak(fc.step) for _ in range(8)],
        "unit_bytes": max(u.unsharded_bytes for u in fsdp2_units(net).units),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
