"""Run by test_fsdp_memory.py as a script: ``forecast()`` of FSDP2 models in plain PyTorch, 2 gloo
processes: blocks of a user class (8 measured steps), then torch's ``nn.TransformerEncoderLayer``
(4), then those checkpointed (4). Each rank writes the forecasts and measured steps to
OUT_DIR/rank{r}.json."""
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

    def __init__(self, width: int, torch_blocks: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True) if torch_blocks
            else Block(width) for _ in range(3)])
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
    from lightning_memplan._torch.fsdp import fsdp2_units
    from lightning_memplan.planner.checkpointing import checkpointed

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    out = {}
    for name, torch_blocks, steps in (("blocks", False, 8), ("torch_blocks", True, 4),
                                      ("torch_blocks_checkpointed", True, 4)):
        net = Net(128, torch_blocks)
        for b in net.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(net, mesh=mesh)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        blocks = [f"blocks.{i}" for i in range(3)] if name.endswith("checkpointed") else []
        with checkpointed(net, blocks):
            # before the first forward: FSDP has not decided which unit is the root yet
            fc = forecast(net, (torch.randn(64, 128),), budget=1.0, backend="aot_eager", optimizer=opt,
                          loss_fn=lambda y: y.pow(2).mean())
            for _ in range(2):
                fc.step()
            measured = [measure_peak(fc.step) for _ in range(steps)]
        out[name] = {
            "predicted": fc.peak_bytes, "fsdp_buffers": fc.breakdown.fsdp_buffers, "status": fc.status,
            "backward_graphs": sum(r._graphs[1] is not None for r in fc.regions),
            "compiled_parameter_bytes": fc.compiled_parameter_bytes,
            "measured": measured,
            "unit_bytes": max(u.unsharded_bytes for u in fsdp2_units(net).units),
            "forward_left_patched": any("forward" in m.__dict__ for m in net.modules()),
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
