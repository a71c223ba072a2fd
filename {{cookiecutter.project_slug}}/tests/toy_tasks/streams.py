"""Streams handed to training as they are ('Streams' in docs/bring-your-own-task.md).

`kind` picks the train split:
- "plain": generated samples, split across DataLoader workers by index with
  `get_worker_info()`, with random augmentation, no state of its own (resumed by counting);
- "stateful": a counter stream with `state_dict()` that takes its share with `stream_part()`,
  through a `ShuffleBuffer` (resumed from the buffer's saved contents);
- "hf": a Hugging Face `datasets` stream over parquet files written by `prepare`, shuffled
  through a buffer when `shuffle > 0` (the replay route) or not (its own state);
- "unsplit" (misuse): every worker yields the same samples;
- "raise" (misuse): the stream raises in the worker after a few samples.
Validation is a plain stream too.
"""

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from under_test import pkg

api = pkg("api")


def reading(i: int) -> tuple[torch.Tensor, int]:
    """Sample number `i`: 8 channels, labelled by the sign of their sum."""
    x = torch.randn(8, generator=torch.Generator().manual_seed(i))
    return x, int(x.sum() > 0)


class Generated(IterableDataset):
    """`n` samples from `first` on; each worker takes every num_workers-th by index."""

    def __init__(self, n: int, first: int = 0, split: bool = True, fail_at: int = -1) -> None:
        self.n, self.first, self.split, self.fail_at = n, first, split, fail_at
        self.noise = 0.05 if split else 0.0  # unsplit: no augmentation, or no two would match

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info and self.split else (0, 1)
        for i in range(worker, self.n, workers):
            if i == self.fail_at:
                raise RuntimeError(f"sensor {i} is unreadable")
            x, y = reading(self.first + i)
            yield x + self.noise * torch.randn(8), y  # augmentation: seeded per batch by the feed


class Counted(IterableDataset):
    """`n` samples; takes its share with stream_part(); its state is the next index."""

    def __init__(self, n: int) -> None:
        self.n, self.next, self.start = n, 0, None

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["next"]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        part = api.stream_part()
        start, self.start = (self.start if self.start is not None else part.index), None
        for i in range(start, self.n, part.count):
            self.next = i + part.count
            yield reading(i)


def from_row(row: dict[str, Any]) -> tuple[torch.Tensor, int]:
    # datasets 5 pauses 5 s at the end of each shuffled pass over parquet files (a guard
    # against an Arrow crash at thread shutdown): with 600 rows, all the time. Set here, in
    # the worker that reads the rows (a fork server's worker shares nothing with the task).
    sys.modules["datasets.config"].SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    return torch.tensor(row["x"]), row["y"]


@dataclass
class Options:
    kind: str = "plain"  # plain | stateful | hf | unsplit | raise
    n: int = 600
    buffer: int = 32  # the shuffle buffer of "stateful" and "hf"
    shuffle: bool = True  # "hf": through a shuffle buffer (replay) or not (its own state)
    external: bool = False  # "hf": read the parquet files from DATA_DIR/external/streams


class Streams(api.Classification):
    Options = Options
    classes = ("negative", "positive")

    def prepare(self, out_dir: Path) -> str:
        if self.options.kind != "hf":
            return "nothing to prepare"
        for shard in range(4):  # (pages with checksums: hf_stream verifies them)
            rows = [reading(i) for i in range(shard, self.options.n, 4)]
            table = {"x": [x.tolist() for x, _ in rows], "y": [y for _, y in rows]}
            api.write_parquet(table, out_dir / f"train-{shard}.parquet")
        return "4 parquet files"

    def datasets(self, data_dir: Path) -> Any:
        o = self.options
        val = Generated(64, first=10**6)
        if o.kind == "stateful":
            train = api.ShuffleBuffer(Counted(o.n), o.buffer, seed=self.cfg.run.seed)
        elif o.kind == "hf":
            folder = self.settings.data_dir / "external" / "streams" if o.external else data_dir
            files = sorted(folder.glob("train-*.parquet"))
            buffer = o.buffer if o.shuffle else 0
            train = api.hf_stream(files, shuffle_buffer=buffer, seed=1, transform=from_row)
        else:
            train = Generated(
                o.n, split=o.kind != "unsplit", fail_at=50 if o.kind == "raise" else -1
            )
        return api.Datasets(train=train, val=val, test=Generated(64, first=2 * 10**6))

    def build_model(self) -> nn.Module:
        return api.build_model(self.cfg.model, (8,), 2)


TASK = Streams
