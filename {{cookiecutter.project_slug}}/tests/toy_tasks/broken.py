"""Blobs with one fault, chosen by `task.fault`: the misuse a user's task may contain.

The crash faults raise in a DataLoader worker (`getitem`, `collate`: samples of unequal shape)
or in the main process (`raise_loss`, `raise_evaluate`); `task.fault_rank` limits them to one
process. Samples 0 and 1 stay good: the trainer's first-sample check batches them in the main
process.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toy_tasks.blobs import Blobs, NoisyDicts
from toy_tasks.blobs import Options as BlobsOptions


class Named(torch.utils.data.Dataset):
    """Samples whose input is a string: nothing a DataLoader can batch."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> tuple[str, int]:
        return f"sample {i}", 0


class Stream(torch.utils.data.IterableDataset):
    """Samples that come one after the other, without a length (a stream)."""

    def __iter__(self) -> Any:
        return iter([(torch.zeros(16), 0)] * 10)


class Faulty(NoisyDicts):
    """Dict samples from 2 on raise (`getitem`), or odd ones from 3 on have an extra feature."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, fault: str) -> None:
        super().__init__(x, y, noise=0.0)
        self.fault = fault

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(i)
        if i < 2:
            return sample
        if self.fault == "getitem":
            raise ValueError(f"sample {i} is unreadable")
        return {"x": torch.cat([sample["x"], sample["x"][: i % 2]]), "y": sample["y"]}


@dataclass
class Options(BlobsOptions):
    # structure | loss | empty | stream | getitem | collate | raise_loss | raise_evaluate
    fault: str = "structure"
    fault_rank: int = -1  # the only rank with the fault; -1: every rank


class FaultError(RuntimeError):
    """The error a faulty task raises in the main process."""


class Broken(Blobs):
    Options = Options

    def datasets(self, data_dir: Path) -> Any:
        sets = super().datasets(data_dir)
        if self.options.fault == "structure":
            sets.train = Named()
        if self.options.fault == "stream":
            sets.train = Stream()
        if self.options.fault == "empty":
            sets.val = torch.utils.data.TensorDataset(torch.zeros(0, 16), torch.zeros(0))
        if self.options.fault in ("getitem", "collate") and self.here():
            train = sets.train
            x, y = (train.x, train.y) if isinstance(train, NoisyDicts) else train.tensors
            sets.train = Faulty(x, y, self.options.fault)
        return sets

    def here(self) -> bool:
        """Whether this process has the fault."""
        rank = self.options.fault_rank
        return rank < 0 or int(os.environ.get("RANK", "0")) == rank

    def evaluate(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        if self.options.fault == "raise_evaluate" and self.here():
            raise FaultError("evaluate() failed")
        return super().evaluate(model, batch)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if self.options.fault == "raise_loss" and self.here():
            raise FaultError("loss() failed")
        x, y = self._pair(batch)
        per_sample = nn.functional.cross_entropy(model(x), y, reduction="none")
        return per_sample if self.options.fault == "loss" else per_sample.mean()


TASK = Broken
