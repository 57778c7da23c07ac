"""``memplan estimate``: will this training step fit that device, and with which plan? Nothing is
allocated: the model is built on the meta device and every plan forecast on fake tensors
(:func:`lightning_memplan.planner.estimate.estimate_plans`).

    memplan estimate --config llama3_8b.json --model-class LlamaForCausalLM --batch 4 --seq 4096 \\
        --dtype bfloat16 --optimizer adamw --target H100
    memplan estimate --factory mypkg.models:make_step --batch 8 --seq 1024 --target A100-80GB --json

A transformers config is a local JSON file (never the hub) and the name of a model class of
``transformers``; the batch is made for the class's main input (``input_ids`` of ``--batch`` x
``--seq`` tokens, or ``pixel_values`` of ``--image-size``) with labels for its head (the loss is the
model's own). A factory ``module:function`` is called as ``function(batch, seq)`` inside
``torch.device("meta")`` and returns ``(model, inputs)``: ``model(*inputs)`` returns the loss, or an
output with ``.loss``.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from lightning_memplan.targets import TARGETS, resolve_target
from lightning_memplan.units import parse_bytes

DTYPES = ("float32", "bfloat16", "float16")
OPTIMIZERS = ("adamw", "adam", "sgd", "none")
_TOKEN_LABELS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForTokenClassification")
_ONE_LABEL = ("ForSequenceClassification", "ForImageClassification")


def _target(text: str) -> str:
    try:
        return resolve_target(text, "memplan estimate", "--target").name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text, argument="--max-memory")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"`{text}` is not valid. Expected a whole number >= 1.")
    return int(text)


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"`{text}` is not an activation memory budget. Expected a number in [0, 1].")
    return value


def register(sub: Any) -> None:
    """Add ``memplan estimate`` to the ``memplan`` command's subparsers."""
    p = sub.add_parser("estimate", help="will it fit? every plan's memory for a device, nothing allocated",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="a transformers config, a local JSON file (with --model-class)")
    src.add_argument("--factory", help="module:function returning (model, inputs), called as function(batch, seq)")
    p.add_argument("--model-class", help="the transformers model class for --config, e.g. LlamaForCausalLM")
    p.add_argument("--batch", type=_positive, default=1, help="examples per step (default 1)")
    p.add_argument("--seq", type=_positive, default=512, help="tokens per example (default 512)")
    p.add_argument("--image-size", type=_positive, default=224, help="pixels per side of an image (default 224)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the parameters' dtype (default float32)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    p.add_argument("--target", type=_target, default="cpu",
                   help=f"the device: {', '.join(TARGETS)} (default cpu)")
    p.add_argument("--max-memory", type=_bytes, default=None, help="bytes a plan may use, e.g. 70GiB "
                   "(default: the target's memory less the CUDA context)")
    p.add_argument("--budgets", type=_budget, nargs="+", default=None, help="activation memory budgets")
    p.add_argument("--no-checkpoint", action="store_true", help="no plans with repeated blocks checkpointed")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=_run)


def _fail(message: str) -> int:
    print(f"memplan estimate: error: {message}", file=sys.stderr)
    return 2


def _transformers_class(name: str | None) -> Any:
    if not name:
        raise ValueError("`--config` needs `--model-class`, the transformers class to build, e.g. LlamaForCausalLM.")
    import transformers

    cls = getattr(transformers, name, None)
    if not isinstance(cls, type) or not hasattr(cls, "config_class") or not name[0].isupper():
        names = [n for n in dir(transformers) if n.endswith(("Model", "LM", "ForCausalLM", "Classification"))]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"`--model-class {name}` is not a model class of transformers "
                         f"{transformers.__version__}.{hint} Expected a class such as 'LlamaForCausalLM'.")
    return cls


def _from_config(path: Path, class_name: str | None, batch: int, seq: int, image: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from lightning_memplan.planner.estimate import LabelledStep

    cls = _transformers_class(class_name)
    try:
        fields = json.loads(path.read_text())
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        config = cls.config_class.from_dict(fields)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"`--config {path}` is not a readable transformers config ({err}). Expected a local "
                         "JSON file of the config's fields (a model's config.json).") from None
    if hasattr(config, "use_cache"):
        config.use_cache = False  # a training step keeps no key/value cache
    name = cls.__name__
    with torch.device("meta"):
        model = cls(config)
        main = getattr(cls, "main_input_name", "input_ids")
        if main == "pixel_values":
            channels = getattr(config, "num_channels", 3)
            x = torch.randn(batch, channels, image, image)
        else:
            x = torch.randint(0, getattr(config, "vocab_size", 2), (batch, seq))
        if name.endswith(_TOKEN_LABELS):
            labels = torch.randint(0, getattr(config, "vocab_size", 2), (batch, seq))
        elif name.endswith(_ONE_LABEL):
            labels = torch.randint(0, max(getattr(config, "num_labels", 2), 1), (batch,))
        else:
            labels = None
    step = LabelledStep(model, main, labelled=labels is not None)
    return step, (x,) if labels is None else (x, labels)


def _from_factory(spec: str, batch: int, seq: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    module_name, _, fn_name = spec.partition(":")
    if not module_name or not fn_name:
        raise ValueError(f"`--factory {spec}` is not valid. Expected module:function, e.g. mypkg.models:make_step.")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"`--factory {spec}` could not be loaded ({err}).") from None
    with torch.device("meta"):
        out = fn(batch, seq)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"`--factory {spec}` returned {type(out).__name__}; expected (model, inputs).")
    model, inputs = out
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _loss(out: Any) -> Any:
    return out.loss if hasattr(out, "loss") else out


def _count(n: int) -> str:
    """``8.03 B``, ``124 M``, ``552 K``: a parameter count in words."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def _run(args: argparse.Namespace) -> int:
    import torch

    from lightning_memplan.planner.estimate import estimate_plans
    from lightning_memplan.planner.search import DEFAULT_BUDGETS

    try:
        if args.config is not None:
            model, inputs = _from_config(args.config, args.model_class, args.batch, args.seq, args.image_size)
        else:
            model, inputs = _from_factory(args.factory, args.batch, args.seq)
    except ValueError as err:
        return _fail(str(err))
    dtype = getattr(torch, args.dtype)
    model = model.to(dtype).train()  # on the meta device: no memory
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = {"adamw": lambda: torch.optim.AdamW(params, lr=1e-4), "adam": lambda: torch.optim.Adam(params, lr=1e-4),
                 "sgd": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9), "none": lambda: None}[args.optimizer]()
    try:
        table = estimate_plans(model, inputs, target=args.target, loss_fn=_loss, optimizer=optimizer,
                               max_memory=args.max_memory, budgets=tuple(args.budgets or DEFAULT_BUDGETS),
                               checkpoint=not args.no_checkpoint)
    except ValueError as err:
        return _fail(str(err))
    if args.json:
        print(json.dumps(table.to_dict(), indent=1))
    else:
        n = sum(p.numel() for p in model.parameters())
        print(f"{type(getattr(model, 'model', model)).__name__}: {_count(n)} parameters ({args.dtype}), "
              f"inputs {[tuple(t.shape) for t in inputs]}, optimizer {args.optimizer}, target {table.target}; "
              f"estimated in {table.seconds:.1f} s, nothing allocated")
        print(table.format())
    return 0
