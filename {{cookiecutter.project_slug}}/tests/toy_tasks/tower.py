"""Blobs through a tower of residual blocks (an `nn.ModuleList`): the units FSDP shards.

`task.adapter_rank > 0` freezes every block's weights at build time and adds a trainable
low-rank update to each (LoRA-style): the checkpoints then hold only what trains.
"""

from dataclasses import dataclass

import torch
from torch import nn

from .blobs import Blobs
from .blobs import Options as BlobsOptions


class Block(nn.Module):
    """x + GELU(W x), W optionally frozen with a trainable low-rank update B A."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.down = nn.Linear(width, rank, bias=False) if rank else None
        self.up = nn.Linear(rank, width, bias=False) if rank else None
        if self.up is not None:
            nn.init.zeros_(self.up.weight)  # the update starts at zero
            self.linear.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.down is not None and self.up is not None:
            h = h + self.up(self.down(x))
        return x + nn.functional.gelu(h)


class Tower(nn.Module):
    def __init__(self, features: int, width: int, depth: int, classes: int, rank: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width, rank) for _ in range(depth))
        self.head = nn.Linear(width, classes)
        if rank:
            self.embed.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@dataclass
class Options(BlobsOptions):
    adapter_rank: int = 0  # > 0: frozen base, trainable low-rank updates of this rank


class TowerTask(Blobs):
    Options = Options

    def on_epoch_start(self, model: nn.Module, epoch: int) -> None:
        del model, epoch  # what is frozen stays frozen (Blobs would thaw the first layer)

    def build_model(self) -> nn.Module:
        o = self.options
        return Tower(
            o.features, self.cfg.model.hidden, self.cfg.model.depth, o.classes, o.adapter_rank
        )


TASK = TowerTask
