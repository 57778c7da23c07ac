"""Models nobody here wrote, small and random-initialized (no hub access), in LightningModules
written the three usual ways:

- ``"loss"``: ``self.model(**batch).loss`` (the model computes its own loss from ``labels=``);
- ``"logits"``: the logits from ``self.model(...)``, the loss in training_step (``F.cross_entropy``,
  ``F.nll_loss`` for Lightning's demo Transformer);
- ``"self"``: ``forward`` calls the model, training_step calls ``self(...)``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB, SEQ, BATCH, IMAGE, CLASSES = 512, 32, 4, 32, 10
WAYS = ("loss", "logits", "self")


def _llama(gqa: bool, layers: int = 2) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2 if gqa else 4,
                                        vocab_size=VOCAB, max_position_embeddings=128))


def _qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                        max_position_embeddings=128))


def _gpt2(layers: int = 2) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=VOCAB, n_positions=128))


def _bert_mlm(layers: int = 2) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128))


def _bert_cls() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128, vocab_size=VOCAB,
                                                    max_position_embeddings=128, num_labels=CLASSES))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=128, num_labels=CLASSES))


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                     num_labels=CLASSES))


def _convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return ConvNextForImageClassification(ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                                         num_labels=CLASSES, image_size=IMAGE))


def _opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    return OPTForCausalLM(OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                    vocab_size=VOCAB, max_position_embeddings=128, word_embed_proj_dim=64))


def _phi() -> nn.Module:
    from transformers import PhiConfig, PhiForCausalLM

    return PhiForCausalLM(PhiConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    vocab_size=VOCAB, max_position_embeddings=128, partial_rotary_factor=0.5))


def _demo_transformer() -> nn.Module:
    from lightning.pytorch.demos import Transformer

    return Transformer(vocab_size=VOCAB, ninp=64, nhead=4, nhid=128, nlayers=2)


#: name -> (builder, task): "causal" (tokens, labels = tokens), "masked" (tokens, padding, labels
#: -100 but at masked places), "classify_text", "classify_image", "demo" (Lightning's Transformer).
ZOO: dict[str, tuple[Callable[..., nn.Module], str]] = {
    "llama": (lambda: _llama(gqa=False), "causal"),
    "llama_gqa": (lambda layers=2: _llama(gqa=True, layers=layers), "causal"),
    "qwen2": (_qwen2, "causal"),
    "gpt2": (_gpt2, "causal"),
    "bert_mlm": (_bert_mlm, "masked"),
    "bert_cls": (_bert_cls, "classify_text"),
    "vit": (_vit, "classify_image"),
    "resnet": (_resnet, "classify_image"),
    "convnext": (_convnext, "classify_image"),
    "opt": (_opt, "causal"),
    "phi": (_phi, "causal"),
    "demo_transformer": (_demo_transformer, "demo"),
}


class ZooData(Dataset):
    """``n`` examples for ``task``, fixed by a seed; BERT's have padding (attention_mask 0 at the end)."""

    def __init__(self, task: str, n: int = 3 * BATCH) -> None:
        g = torch.Generator().manual_seed(0)
        self.task, self.items = task, []
        for i in range(n):
            if task == "classify_image":
                self.items.append({"pixel_values": torch.randn(3, IMAGE, IMAGE, generator=g),
                                   "labels": torch.tensor(i % CLASSES)})
                continue
            ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
            if task in ("causal", "demo"):
                self.items.append({"input_ids": ids, "labels": ids.clone()})
                continue
            mask = torch.ones(SEQ, dtype=torch.long)
            mask[SEQ - 1 - i % 8:] = 0  # padded
            if task == "masked":
                labels = torch.full((SEQ,), -100)
                labels[::5] = ids[::5]
                self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
            else:
                self.items.append({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(i % CLASSES)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def _cross_entropy(task: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss users write in training_step on the logits (shifted for a causal LM)."""
    if task == "causal":
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
    if task == "masked":
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
    return F.cross_entropy(logits, labels)


class ZooModule(LightningModule):
    """``self.model`` is the zoo model ``name`` (``layers``: its depth, where the builder takes one);
    training_step written the way ``way`` says."""

    def __init__(self, name: str, way: str, layers: int | None = None) -> None:
        super().__init__()
        if way not in WAYS:
            raise ValueError(f"way={way!r}: expected one of {WAYS}")
        build, self.task = ZOO[name]
        if self.task == "demo" and way == "loss":
            raise ValueError("Lightning's demo Transformer computes no loss of its own")
        self.way = way
        self.model = build() if layers is None else build(layers)
        #: The loss of every training step, in order.
        self.losses: list[float] = []

    def forward(self, **inputs: Any) -> torch.Tensor:
        if self.task == "demo":
            return self.model(inputs["input_ids"], inputs["labels"])
        return self.model(**inputs).logits

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        labels = batch["labels"]
        if self.way == "loss":
            loss = self.model(**batch).loss
        elif self.task == "demo":  # as in Lightning's docs
            out = self.model(inputs["input_ids"], labels) if self.way == "logits" else self(**batch)
            loss = F.nll_loss(out, labels.view(-1))
        else:
            logits = self.model(**inputs).logits if self.way == "logits" else self(**inputs)
            loss = _cross_entropy(self.task, logits, labels)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(ZooData(self.task), batch_size=BATCH)


#: Ways users train beside their training_step: ``"own_ckpt"`` (transformers' own
#: ``gradient_checkpointing_enable()``), ``"accumulate"`` (``accumulate_grad_batches=2``),
#: ``"bf16"`` (``precision="bf16-mixed"``), ``"lora"`` (every base parameter frozen, a low-rank
#: adapter on the attention's query and value projections).
OPTIONS = ("own_ckpt", "accumulate", "bf16", "lora")


class LowRankAdapter(nn.Module):
    """``base(x) + x A^T B^T`` with ``A``: (rank, n_in) and ``B``: (n_out, rank), ``B`` zero at the start
    (the adapted layer computes what ``base`` does until ``B`` trains); ``base`` a ``nn.Linear`` or
    transformers' ``Conv1D`` (GPT-2's fused query-key-value projection, weight (n_in, n_out))."""

    def __init__(self, base: nn.Module, n_in: int, n_out: int, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, n_in) * 0.01)
        self.b = nn.Parameter(torch.zeros(n_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


_ADAPTED = ("q_proj", "v_proj", "query", "value", "c_attn")


def add_adapters(model: nn.Module) -> int:
    """Freeze every parameter of ``model`` and wrap its attention's query and value projections
    (:data:`_ADAPTED`) in a :class:`LowRankAdapter`; the number wrapped (0: none found)."""
    model.requires_grad_(False)
    wrapped = 0
    for sub in list(model.modules()):
        for attr in _ADAPTED:
            layer = getattr(sub, attr, None)
            if isinstance(layer, nn.Linear):
                setattr(sub, attr, LowRankAdapter(layer, layer.in_features, layer.out_features))
            elif type(layer).__name__ == "Conv1D" and isinstance(getattr(layer, "weight", None), torch.Tensor):
                setattr(sub, attr, LowRankAdapter(layer, *layer.weight.shape))
            else:
                continue
            wrapped += 1
    return wrapped


def with_option(module: ZooModule, option: str) -> dict[str, Any]:
    """Apply ``option`` (:data:`OPTIONS`) to ``module``; the ``Trainer`` arguments it needs."""
    if option not in OPTIONS:
        raise ValueError(f"option={option!r}: expected one of {OPTIONS}")
    if option == "own_ckpt":
        module.model.gradient_checkpointing_enable()
    elif option == "lora" and not add_adapters(module.model):
        raise ValueError(f"option='lora': {type(module.model).__name__} has none of {_ADAPTED} to adapt")
    return {"accumulate": {"accumulate_grad_batches": 2}, "bf16": {"precision": "bf16-mixed"}}.get(option, {})
