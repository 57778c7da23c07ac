"""Tiny LightningModules for callback tests (small, so compiles stay fast on 2 CPU cores)."""
from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TinyNet(LightningModule):
    """A residual MLP with repeated blocks; logs its loss like a real module."""

    def __init__(self, width: int = 32, depth: int = 3, batch: int = 16, batches: int = 4, last: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)
        self._width, self._batch, self._batches = width, batch, batches
        self._last = last  # rows of an incomplete last batch (DataLoader's default drop_last=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        n = self._batch * self._batches + self._last
        x = torch.randn(n, self._width, generator=g)
        return DataLoader(TensorDataset(x, x[:, :1].clone()), batch_size=self._batch)


class _Cache:
    """A Python object blocks write to, as transformers' layers fill a KV cache."""

    last: torch.Tensor | None = None


class _CachingBlock(Block):
    def __init__(self, width: int, cache: _Cache) -> None:
        super().__init__(width)
        self.cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.last = x.detach()
        return super().forward(x)


class CachingNet(TinyNet):
    """:class:`TinyNet` whose blocks write their input to one shared Python object: dynamo runs such
    a block eagerly under ``torch.utils.checkpoint``, so a search cannot emulate its checkpointing
    and traces each checkpoint set with the blocks really wrapped."""

    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__(width=width, depth=depth)
        cache = _Cache()
        self.blocks = nn.ModuleList([_CachingBlock(width, cache) for _ in range(depth)])


class Wrapper(LightningModule):
    """The common layout: the network is an attribute, and training_step calls ``self.model(x)``."""

    def __init__(self, model: TinyNet | None = None) -> None:
        super().__init__()
        self.model = TinyNet() if model is None else model

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return self.model.train_dataloader()


class WideHead(TinyNet):
    """A classifier over many classes, its loss computed in training_step (eager): cross_entropy
    keeps a log-softmax as large as the logits, and its backward makes two more."""

    def __init__(self, classes: int = 4000, batches: int = 3) -> None:
        super().__init__(width=32, batch=128, batches=batches)
        self.head = torch.nn.Linear(32, classes)
        self._classes = classes

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), (y[:, 0].abs() * 997).long() % self._classes)


class HeadOutside(WideHead):
    """WideHead planned through ``submodule="backbone"``: the 4,000-class head is an attribute of
    the LightningModule that training_step calls eagerly on the backbone's outputs. Its weight is
    saved for backward (a parameter: in the baseline, not the loss's bytes), and its gradient
    (512 KB) is freed by zero_grad and made again by the eager part of the backward."""

    def __init__(self) -> None:
        super().__init__(batches=4)
        self.backbone = torch.nn.Sequential(*self.blocks)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(self.backbone(x)), (y[:, 0].abs() * 997).long() % self._classes)


class LossInSkippedFrame(WideHead):
    """WideHead whose forward takes the targets and returns the loss (Hugging Face's ``labels=``),
    with a graph break inside its loop over the blocks: dynamo skips the forward's frame, compiles
    each block on its own, and runs the head and the cross-entropy eagerly inside the forward."""

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
            torch._dynamo.graph_break()
        logits = self.head(x)
        return logits if target is None else torch.nn.functional.cross_entropy(logits, target)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self(x, (y[:, 0].abs() * 997).long() % self._classes)


class WideHeadAccuracy(WideHead):
    """The common torchmetrics pattern: accuracy updated on the logits in training_step. Its
    update counts (target, prediction) pairs with a bincount of classes**2 int64 bins: 8 MB for
    1,000 classes, made and freed between the forward and the backward."""

    def __init__(self) -> None:
        super().__init__(classes=1000)
        from torchmetrics.classification import MulticlassAccuracy

        self.acc = MulticlassAccuracy(num_classes=1000)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        target = (y[:, 0].abs() * 997).long() % self._classes
        logits = self(x)
        self.acc(logits, target)
        self.log("train_acc", self.acc)
        return torch.nn.functional.cross_entropy(logits, target)


class WideHeadManual(WideHead):
    """WideHead with manual optimization: ``manual_backward`` inside training_step, the logits
    still referenced there."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        opt.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        opt.step()
        return loss


class WideHeadTwoViews(WideHead):
    """Two calls of the forward per step (the batch and its flip), each with its own cross_entropy."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        target = (y[:, 0].abs() * 997).long() % self._classes
        ce = torch.nn.functional.cross_entropy
        return ce(self(x), target) + ce(self(x.flip(0)), target)


class BytesIn(TinyNet):
    """Batches of uint8 features that training_step converts to floats (as image pipelines do):
    the forward's input is made inside the step, four times the batch's bytes."""

    def __init__(self) -> None:
        super().__init__(width=256, depth=1, batch=64, batches=3)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x.float() / 255), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)  # no temporaries: the step peaks in backward

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (self._batch * self._batches, self._width), generator=g, dtype=torch.uint8)
        return DataLoader(TensorDataset(x, torch.randn(len(x), 1, generator=g)), batch_size=self._batch)


class LossInModel(LightningModule):
    """Hugging Face's ``model(ids, labels=ids)`` in small: the forward returns the logits and the
    loss it computes from them after a graph break; training_step returns the loss, or with
    ``returns_logits`` a dict that also holds the logits (Lightning keeps them through the backward)."""

    def __init__(self, returns_logits: bool = False, classes: int = 4000) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, classes)
        self.returns_logits = returns_logits

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.body(x))
        torch._dynamo.graph_break()
        return logits, torch.nn.functional.cross_entropy(logits, y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        x, y = batch
        logits, loss = self(x, y)
        return {"loss": loss, "logits": logits} if self.returns_logits else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256 * 3, 64, generator=g)
        return DataLoader(TensorDataset(x, torch.arange(len(x)) % self.head.out_features), batch_size=256)


class Recurrent(TinyNet):
    """A linear layer, then a 2-layer LSTM over sequences of 8 steps, then a linear head: dynamo runs
    nn.LSTM eagerly unless ``torch._dynamo.config.allow_rnn`` is True. (With it, torch 2.13 fails to
    compile an LSTM whose input does not require grad: the linear layer in front avoids that.)"""

    def __init__(self) -> None:
        super().__init__(width=32, batch=16, batches=3)
        self.blocks = nn.ModuleList()  # TinyNet's, unused here
        self.proj = nn.Linear(32, 32)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.proj(x).unsqueeze(1).expand(-1, 8, -1))[0][:, -1])


class UnusedHead(TinyNet):
    """TinyNet with a trainable head that training never calls (a validation-only or leftover
    module): its 264 KB of parameters never get a gradient, so they hold none between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(32, 2048)


class TwoPhaseGAN(LightningModule):
    """Lightning's GAN pattern: manual optimization with two optimizers, the generator's backward
    and step, then the discriminator's forward, backward and step in the same training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.disc = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gen(z)

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> None:
        (x,) = batch
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self(torch.randn(x.shape[0], 8))
        opt_g.zero_grad()
        self.manual_backward(bce(self.disc(fake), torch.ones(x.shape[0], 1)))
        opt_g.step()
        real, faked = self.disc(x), self.disc(fake.detach())
        opt_d.zero_grad()
        self.manual_backward(bce(real, torch.ones_like(real)) + bce(faked, torch.zeros_like(faked)))
        opt_d.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.gen.parameters(), 2e-4), torch.optim.Adam(self.disc.parameters(), 2e-4)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(48, 16, generator=torch.Generator().manual_seed(0))), batch_size=16)


class _NotTraced(nn.Module):
    """A layer whose forward dynamo is told not to trace (as some libraries mark custom kernels)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)

    @torch._dynamo.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x))


class EagerMiddle(TinyNet):
    """TinyNet with a layer in the middle of the forward that runs eagerly (``torch._dynamo.disable``):
    dynamo compiles the layers before and after it as two graphs."""

    def __init__(self) -> None:
        super().__init__(width=32, batch=64, batches=3)
        self.mid = _NotTraced(32)
        self.down = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        x = self.down(self.mid(x))
        for b in self.blocks[1:]:
            x = b(x)
        return self.head(x)


def varying_rows_loader(rows: tuple[int, ...], width: int = 32) -> DataLoader:
    """One batch per entry of ``rows``, of that many rows: each new row count is a new input shape."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for n in rows:
        x = torch.randn(n, width, generator=g)
        batches.append((x, x[:, :1].clone()))
    return DataLoader(batches, batch_size=None)


class VaryingRows(WideHead):
    """WideHead fed batches of varying rows, as a sampler that batches by length gives: each new
    row count is a new input shape (a static graph of its own), and the eager cross-entropy on the
    logits grows with the rows."""

    def __init__(self, rows: tuple[int, ...] = (128, 64, 192, 64)) -> None:
        super().__init__(batches=len(rows))
        self._rows = rows

    def train_dataloader(self) -> DataLoader:
        return varying_rows_loader(self._rows)


class VaryingRowsAccuracy(WideHeadAccuracy):
    """WideHeadAccuracy on batches of varying rows: its metric's 8 MB bincount does not grow with
    the rows, so the eager code at other shapes is no multiple of the first batch's."""

    def train_dataloader(self) -> DataLoader:
        return varying_rows_loader((128, 64, 192, 64))


class FrozenStem(WideHead):
    """WideHead whose forward runs its first block under ``torch.no_grad()`` (a frozen stem): the
    compiled graph reads that block's weights, and autograd links them to the compiled backward,
    but they get no gradient, no optimizer state, and hold none between steps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            x = self.blocks[0](x)
        for b in self.blocks[1:]:
            x = b(x)
        return self.head(x)


class VaryingWide(TinyNet):
    """TinyNet (width 128, 4 blocks, MSE loss) whose first batch has 256 rows and later ones 1,024:
    the activations grow fourfold, and a plan chosen at 256 rows does not fit a byte target at 1,024."""

    def __init__(self) -> None:
        super().__init__(width=128, depth=4)

    def train_dataloader(self) -> DataLoader:
        return varying_rows_loader((256, 1024, 256, 1024, 256, 1024), width=128)


class LoopingLM(LightningModule):
    """nanoGPT's layout as ``self.model``: token and position embeddings, blocks called in a loop of
    the model's own forward, a final norm and a vocabulary head; training_step's cross-entropy on
    the logits is eager code after the call. With ``regional=True`` the head is compiled on its
    own beside the blocks, so the forecast's stand-in loss runs in a region of its own."""

    def __init__(self, layers: int = 2, dim: int = 16, vocab: int = 128, seq: int = 64, batch: int = 8) -> None:
        super().__init__()
        self.model = _LoopingNet(layers, dim, vocab, seq)
        self._vocab, self._seq, self._batch = vocab, seq, batch

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x).view(-1, self._vocab), y.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, self._vocab, (4 * self._batch, self._seq), generator=g)
        return DataLoader(TensorDataset(x, x.roll(-1, 1)), batch_size=self._batch)


class _LoopingNet(nn.Module):
    def __init__(self, layers: int, dim: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))
