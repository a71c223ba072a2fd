"""Blobs with one fault, chosen by `task.fault`: the misuse a user's task may contain."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toy_tasks.blobs import Blobs
from toy_tasks.blobs import Options as BlobsOptions


class Named(torch.utils.data.Dataset):
    """Samples whose input is a string: nothing a DataLoader can batch."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> tuple[str, int]:
        return f"sample {i}", 0


@dataclass
class Options(BlobsOptions):
    fault: str = "structure"  # structure | loss | empty


class Broken(Blobs):
    Options = Options

    def datasets(self, data_dir: Path) -> Any:
        sets = super().datasets(data_dir)
        if self.options.fault == "structure":
            sets.train = Named()
        if self.options.fault == "empty":
            sets.val = torch.utils.data.TensorDataset(torch.zeros(0, 16), torch.zeros(0))
        return sets

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        per_sample = nn.functional.cross_entropy(model(batch[0]), batch[1], reduction="none")
        return per_sample if self.options.fault == "loss" else per_sample.mean()


TASK = Broken
