"""The shipped stream example: the digits, written as WebDataset-style tar shards and streamed.

`prepare` writes each split of the raw digits into tar shards under data/processed/stream
(`<split>-000000.tar`, ...; a sample is `<key>.pixels`, 64 bytes of pixel counts, and
`<key>.cls`, its label), as another group's shards would arrive. Training reads them as a
stream: `TarShards` gives each process and worker whole shards in a seeded order per epoch,
and a `ShuffleBuffer` mixes the samples; both keep a position, so a stop mid-epoch resumes
to the same weights. Inside a job the shards are staged to node-local disk like any
processed data. Copy this module for tar shards of your own: change `decode`.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..api import (
    Classification,
    DataError,
    Datasets,
    ShuffleBuffer,
    TarShards,
    build_model,
    class_labels,
    split_indices,
    write_tar_shards,
)
from .digits import RAW_FILE, read_digits


def decode(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample's bytes as (1 x 8 x 8 pixels in 0..1, label); runs in the DataLoader workers."""
    pixels = torch.frombuffer(bytearray(sample["pixels"]), dtype=torch.uint8)
    return (pixels.float() / 16.0).reshape(1, 8, 8), torch.tensor(int(sample["cls"]))


@dataclass
class Options:
    """How the shards are written and shuffled."""

    shards: int = 8  # per split: every process and worker reads whole shards, so >= their count
    buffer: int = 256  # samples in the shuffle buffer (its contents are part of each checkpoint)


class Stream(Classification):
    """Ten classes from tar shards, read as a stream."""

    Options = Options
    classes = tuple(str(d) for d in range(10))

    def prepare(self, out_dir: Path) -> str:
        """The seeded splits of the raw digits as tar shards, `shards` per split."""
        inputs, values = read_digits(self.settings.raw_dir)
        labels = class_labels(values, 10, f"{self.settings.raw_dir / RAW_FILE}")
        data = self.cfg.data
        parts = split_indices(len(labels), data.val_fraction, data.test_fraction, data.split_seed)
        counts = (inputs * 16).round().to(torch.uint8).reshape(len(labels), 64)
        for split, rows in parts.items():
            samples = (
                {
                    "__key__": f"{i:06d}",
                    "pixels": counts[i].numpy().tobytes(),
                    "cls": b"%d" % labels[i],
                }
                for i in rows.tolist()
            )
            per_shard = math.ceil(len(rows) / self.options.shards)
            write_tar_shards(samples, out_dir, split, per_shard)
        sizes = ", ".join(f"{name} {len(parts[name])}" for name in ("train", "val", "test"))
        return f"task {self.name}: {sizes} samples in {self.options.shards} tar shards per split"

    def datasets(self, data_dir: Path) -> Datasets:
        """Each split as a stream of its shards; training's through a shuffle buffer."""
        splits = {}
        for split in ("train", "val", "test"):
            files = sorted(data_dir.glob(f"{split}-*.tar"))
            if not files:
                raise DataError(f"no {split}-*.tar in {data_dir}: run `prepare` first")
            splits[split] = TarShards(files, decode, seed=self.cfg.run.seed)
        splits["train"] = ShuffleBuffer(
            splits["train"], self.options.buffer, seed=self.cfg.run.seed
        )
        return Datasets(**splits)

    def build_model(self) -> nn.Module:
        """`model.name` (mlp or cnn) for 1 x 8 x 8 inputs and 10 classes."""
        return build_model(self.cfg.model, (1, 8, 8), 10)


TASK = Stream
