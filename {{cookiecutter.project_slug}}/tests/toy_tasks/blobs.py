"""Gaussian blobs: a learnable, tiny classification task with data made in memory.

`task.samples = "dicts"` serves the same data as a map-style data set of {"x", "y"} dicts
with random noise added per sample in `__getitem__` (augmentation), so the DataLoader path,
workers and the per-sample seeding are exercised. `task.freeze_epochs` freezes the first layer
for that many epochs, and `task.first_lr` gives it a learning rate of its own (fine-tuning).
`task.usr1_step` / `task.usr1_in_val`: the process with rank 1 sends itself SIGUSR1 during
that training step / during its first validation pass (a stop that one rank alone sees).
`task.weights`: a weights file `build_model` loads with `read_weights`, as a task reads a
teacher's.
"""

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from under_test import pkg

Classification = pkg("task_kinds").Classification
read_weights = pkg("api").read_weights
Datasets = pkg("task").Datasets
split_indices = pkg("task").split_indices
build_model = pkg("models").build_model


def blobs(n: int, features: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around `classes` random centres, and their labels."""
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, features, generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    return centres[labels] + torch.randn(n, features, generator=g), labels


class NoisyDicts(Dataset):
    """{"x": point + noise, "y": label}; the noise is drawn anew for every load."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, noise: float) -> None:
        self.x, self.y, self.noise = x, y, noise

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i] + self.noise * torch.randn(self.x.shape[1:]), "y": self.y[i]}


@dataclass
class Options:
    n: int = 600
    features: int = 16
    classes: int = 4
    samples: str = "tensors"  # tensors | dicts
    noise: float = 0.3  # augmentation noise of the dict samples
    freeze_epochs: int = 0  # first layer frozen for this many epochs
    first_lr: float = 0.0  # > 0: the first layer's own learning rate
    usr1_step: int = 0  # > 0: rank 1 signals itself during this step (counted from the start)
    usr1_in_val: bool = False  # rank 1 signals itself during its first validation pass
    weights: str = ""  # a weights file build_model loads (read_weights)


class Blobs(Classification):
    Options = Options

    def datasets(self, data_dir: Path) -> Any:
        del data_dir  # made in memory
        o = self.options
        x, y = blobs(o.n, o.features, o.classes, seed=0)
        self.classes = [str(c) for c in range(o.classes)]
        parts = split_indices(o.n, 0.15, 0.15, seed=0)
        if o.samples == "dicts":
            return Datasets(**{k: NoisyDicts(x[i], y[i], o.noise) for k, i in parts.items()})
        return Datasets(**{k: TensorDataset(x[i], y[i]) for k, i in parts.items()})

    def build_model(self) -> nn.Module:
        model = build_model(self.cfg.model, (self.options.features,), self.options.classes)
        if self.options.weights:
            model.load_state_dict(read_weights(Path(self.options.weights)))
        return model

    @staticmethod
    def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return (batch["x"], batch["y"]) if isinstance(batch, dict) else batch

    steps = 0  # loss calls of this process (one per step without accumulation)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.steps += 1
        if self.steps == self.options.usr1_step:
            self.signal_on_rank1()
        return super().loss(model, self._pair(batch))

    def evaluate(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        if self.options.usr1_in_val:
            self.options.usr1_in_val = False
            self.signal_on_rank1()
        return super().evaluate(model, self._pair(batch))

    @staticmethod
    def signal_on_rank1() -> None:
        if os.environ.get("SLURM_PROCID") == "1":
            os.kill(os.getpid(), signal.SIGUSR1)

    def first_layer(self, model: nn.Module) -> nn.Module:
        return next(m for m in model.modules() if isinstance(m, nn.Linear))

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        if self.options.first_lr <= 0:
            return super().param_groups(model)
        first = list(self.first_layer(model).parameters())
        ids = {id(p) for p in first}
        rest = [p for p in model.parameters() if id(p) not in ids]
        return [
            {"params": first, "lr": self.options.first_lr, "name": "first"},
            {"params": rest, "name": "rest"},
        ]

    def on_epoch_start(self, model: nn.Module, epoch: int) -> None:
        for p in self.first_layer(model).parameters():
            p.requires_grad_(epoch >= self.options.freeze_epochs)


TASK = Blobs
