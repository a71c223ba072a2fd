"""Two noisy views of random points, an encoder and an InfoNCE loss over the global batch.

Each view's row must pick its partner among all rows of the batch. With `task.gather` the
negatives are every process's rows (`gather_with_grad`), so two processes of 16 compute the
loss one process computes on 32; without it, each process's own 16 only. The share of rows
that pick their partner (`top1`, over the same rows) is recorded for the train rows. On
validation every row's embeddings are kept (`Task.keep`), and `recall1` is the share of rows
whose partner is the nearest among all rows of the split: the same for any number of
processes, where a mean of per-batch values would not be.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from under_test import pkg

api = pkg("api")


@dataclass
class Options:
    n: int = 640
    features: int = 16
    gather: bool = True  # negatives from every process (else from this process's rows only)


def embed(model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Both views' embeddings, of length 1."""
    a, b = (nn.functional.normalize(model(view), dim=1) for view in batch)
    return a, b


def info_nce(model: nn.Module, batch: Any, gather: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss of each row finding its partner among the batch's rows; the rows'
    logits (row i's partner is column i)."""
    a, b = embed(model, batch)
    if gather:  # the whole global batch, on every process alike
        a, b = api.gather_with_grad(a), api.gather_with_grad(b)
    logits = a @ b.t() / 0.1
    return nn.functional.cross_entropy(logits, torch.arange(len(a)), reduction="sum"), logits


class Contrastive(api.Task):
    Options = Options
    metrics = ("loss", "recall1")
    train_scalars = ("top1",)

    def datasets(self, data_dir: Path) -> Any:
        del data_dir  # made in memory
        g = torch.Generator().manual_seed(0)
        points = torch.randn(self.options.n, self.options.features, generator=g)
        views = [points + 0.3 * torch.randn(points.shape, generator=g) for _ in range(2)]
        parts = api.split_indices(self.options.n, 0.1, 0.1, seed=0)
        pairs = {k: TensorDataset(views[0][i], views[1][i]) for k, i in parts.items()}
        return api.Datasets(**pairs)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.options.features, 32), nn.GELU(), nn.Linear(32, 8))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        # With gather every process computes the mean over the global batch; DDP's average
        # of the processes' gradients is then that mean's gradient.
        total, logits = info_nce(model, batch, self.options.gather)
        self.record("top1", (logits.argmax(1) == torch.arange(len(logits))).float().mean())
        return total / len(logits)

    def evaluate(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        # Validation batches differ in number between processes: no collective here.
        total, logits = info_nce(model, batch, gather=False)
        a, b = embed(model, batch)
        self.keep("a", a)
        self.keep("b", b)
        return {"loss": total.detach(), "n": torch.tensor(float(len(logits)))}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        nearest = (sums["a"] @ sums["b"].t()).argmax(dim=1)
        recall1 = (nearest == torch.arange(len(nearest))).float().mean().item()
        return {"loss": sums["loss"].item() / sums["n"].item(), "recall1": recall1}


TASK = Contrastive
