"""A stream packed into shards by `prepare`: the recipe of "Streams" in bring-your-own-task.md.

`Readings` stands for any stream (an `IterableDataset`, tar shards, a sensor feed): samples
arrive one by one, with no length and no random access. `prepare` iterates it once and
packs every sample's bytes with `write_shards`; `datasets` reads them back by index with
`ShardReader`, so training gets a map-style data set and every guarantee that comes with it
(exact mid-epoch resume, equal shares per process, seeded augmentation).
"""

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from conftest import pkg

Classification = pkg("task_kinds").Classification
Datasets = pkg("task").Datasets
ShardReader, write_shards = pkg("data.shards").ShardReader, pkg("data.shards").write_shards
build_model = pkg("models").build_model


class Readings(IterableDataset):
    """The stream: `n` readings of 8 channels, labelled by the sign of their sum."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n):
            x = torch.randn(8, generator=g)
            yield x, int(x.sum() > 0)


class Packed(Dataset):
    """One split of the packed stream, read back by index."""

    def __init__(self, folder: Path, split: str) -> None:
        self.reader = ShardReader(folder, split)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.load(io.BytesIO(self.reader.read(i)), weights_only=True)
        return x, self.reader.targets[i]


@dataclass
class Options:
    n: int = 400


class Stream(Classification):
    Options = Options
    classes = ("negative", "positive")

    def prepare(self, out_dir: Path) -> str:
        items: list[bytes] = []
        labels: list[int] = []
        for x, y in Readings(self.options.n):  # one pass over the stream
            buffer = io.BytesIO()
            torch.save(x, buffer)
            items.append(buffer.getvalue())
            labels.append(y)
        ends = {"train": int(0.7 * len(items)), "val": int(0.85 * len(items)), "test": len(items)}
        start = 0
        for split, end in ends.items():  # in stream order: no sample in two splits
            write_shards(items[start:end], torch.tensor(labels[start:end]), out_dir, split, 1.0)
            start = end
        return f"task {self.name}: {len(items)} readings packed into shards"

    def datasets(self, data_dir: Path) -> Any:
        return Datasets(**{split: Packed(data_dir, split) for split in ("train", "val", "test")})

    def build_model(self) -> nn.Module:
        return build_model(self.cfg.model, (8,), 2)


TASK = Stream
