"""Will it fit? Large models estimated without allocating, against the peers' formulas, in one run.

    python benchmarks/estimate.py                       # all five models, 4 x 4096 tokens, H100
    python benchmarks/estimate.py --models llama3-8b --budgets 1.0 0.5

Each model is built from its published shapes on the meta device (random init never runs) with
bf16 parameters, and :func:`lightning_memplan.planner.estimate.estimate_plans` forecasts every plan
(the budgets, with and without every decoder layer checkpointed; AdamW, the model's own loss) for
the target, each model in a process of its own (its wall time and max RSS are its own). Beside
each, computed in the same run:

- accelerate's ``estimate-memory`` answer for training with Adam: 4 x the parameters' bytes
  (weights, gradients, two optimizer states; no activations). Reproduced from its documented
  formula, not installed.
- Megatron's theoretical activation memory (Korthikanti et al. 2022, Table 2, no tensor or
  sequence parallelism): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer without recomputation, ``2*s*b*h``
  with full recomputation, plus the same 4 x parameter bytes.

Columns: ours is the reserved bytes of the CUDA caching-allocator model (what an out-of-memory
error is about) of the unplanned step and of the smallest plan; the ratios are the peers over ours.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from typing import Any

GiB = 2**30

#: name -> (transformers config class, model class, fields, kind)
MODELS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "llama3-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=8192), "lm"),
    "llama3-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192), "lm"),
    "mistral-7b": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32000, max_position_embeddings=32768, sliding_window=None), "lm"),
    "neox-20b": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=6144, intermediate_size=24576, num_hidden_layers=44, num_attention_heads=64, vocab_size=50432,
        rotary_pct=0.25, max_position_embeddings=4096), "lm"),
    "vit-h": ("ViTConfig", "ViTForImageClassification", dict(
        hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16, image_size=224,
        patch_size=14, num_labels=1000), "image"),
}


def _one(name: str, batch: int, seq: int, target: str, budgets: list[float]) -> dict[str, Any]:
    """Estimate one model in this process; returns what the table needs."""
    import torch
    import transformers

    from lightning_memplan.planner.estimate import LabelledStep, estimate_plans

    warnings.simplefilter("ignore")
    cfg_cls, model_cls, fields, kind = MODELS[name]
    t0 = time.perf_counter()
    config = getattr(transformers, cfg_cls)(**fields, use_cache=False) if kind == "lm" else \
        getattr(transformers, cfg_cls)(**fields)
    with torch.device("meta"):
        model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
        if kind == "lm":
            x = torch.randint(0, config.vocab_size, (batch, seq))
            labels, s = x, seq
        else:
            x = torch.randn(batch, 3, config.image_size, config.image_size, dtype=torch.bfloat16)
            labels, s = torch.randint(0, config.num_labels, (batch,)), (config.image_size // config.patch_size) ** 2 + 1
        step = LabelledStep(model, "input_ids" if kind == "lm" else "pixel_values").train()
        opt = torch.optim.AdamW(step.parameters(), lr=1e-4)
    table = estimate_plans(step, (x, labels), target=target, loss_fn=lambda loss: loss, optimizer=opt,
                           budgets=tuple(budgets))
    wall = time.perf_counter() - t0
    n = sum(p.numel() for p in step.parameters())
    param_bytes = n * 2
    h, a, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    megatron_act = layers * s * batch * h * (34 + 5 * a * s / h)
    megatron_full = layers * 2 * s * batch * h
    rows = {r.plan: {"reserved": r.reserved, "allocated": r.allocated, "extra": r.extra_compute, "fits": r.fits}
            for r in table.rows}
    unplanned = next((r for r in table.rows if not r.checkpointed and r.budget == max(budgets)), None)
    smallest = min(table.rows, key=lambda r: r.judged_bytes)
    return {"model": name, "params": n, "wall_s": wall, "maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "rows": rows, "unplanned": unplanned.judged_bytes if unplanned else None, "smallest": smallest.judged_bytes,
            "smallest_plan": smallest.plan, "best": table.best.plan if table.best else None,
            "accelerate": 4 * param_bytes, "megatron": 4 * param_bytes + megatron_act,
            "megatron_full": 4 * param_bytes + megatron_full, "skipped": list(table.skipped),
            "unknown_workspaces": sorted({p for r in table.rows for p in r.problems if "workspaces" in p})[:1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--target", default="H100")
    p.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5])
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(_one(a.one, a.batch, a.seq, a.target, a.budgets)))
        return
    print(f"target {a.target}, batch {a.batch} x seq {a.seq} (ViT: {a.batch} images), bf16 parameters, AdamW, "
          f"budgets {a.budgets} with and without every layer checkpointed; nothing allocated")
    head = (f"{'model':<11}{'params':>8}{'wall s':>8}{'RSS GiB':>9}{'ours: none':>12}{'smallest':>10}"
            f"{'accelerate':>12}{'Megatron':>10}{'Megatron full-AC':>18}")
    print(head)
    print("-" * len(head))
    results = []
    for name in a.models:
        cmd = [sys.executable, __file__, "--one", name, "--batch", str(a.batch), "--seq", str(a.seq),
               "--target", a.target, "--budgets", *map(str, a.budgets)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name:<11} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"{name:<11}{r['params'] / 1e9:>7.2f}B{r['wall_s']:>8.1f}{r['maxrss_gib']:>9.2f}"
              f"{r['unplanned'] / GiB:>12.1f}{r['smallest'] / GiB:>10.1f}{r['accelerate'] / GiB:>12.1f}"
              f"{r['megatron'] / GiB:>10.1f}{r['megatron_full'] / GiB:>18.1f}")
    print("\n(GiB; ours: the caching allocator's reserved bytes, baseline included; peers: their formulas)")
    for r in results:
        print(f"{r['model']}: smallest plan {r['smallest_plan']}; fastest that fits {a.target}: {r['best']}; "
              f"accelerate/ours(none) {r['accelerate'] / r['unplanned']:.2f}, Megatron/ours(none) "
              f"{r['megatron'] / r['unplanned']:.2f}" + (f"; not forecast: {r['skipped']}" if r["skipped"] else "")
              + (f"\n  {r['unknown_workspaces'][0]}" if r["unknown_workspaces"] else ""))


if __name__ == "__main__":
    main()
