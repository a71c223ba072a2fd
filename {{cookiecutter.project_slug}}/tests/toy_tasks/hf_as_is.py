"""A Hugging Face `datasets` stream handed to training as it is, the way its own docs build it.

`load_dataset("parquet", ..., streaming=True)` over the parquet files of the `streams` toy task
(`task.kind=hf`, prepared first), shuffled through its own buffer when `task.shuffle` is true
(`.shuffle(seed=..., buffer_size=...)`) or not. No `hf_stream`, no wrapper.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toy_tasks.streams import Generated, Streams, api


@dataclass
class Options:
    shuffle: bool = True
    buffer: int = 32


class AsIs(Streams):
    Options = Options  # type: ignore[assignment]

    def datasets(self, data_dir: Path) -> Any:
        from datasets import load_dataset  # noqa: PLC0415  (the datasets extra)

        folder = self.settings.data_dir / "processed" / "toy_tasks.streams"
        files = [str(path) for path in sorted(folder.glob("train-*.parquet"))]
        train = load_dataset("parquet", data_files=files, split="train", streaming=True)
        if self.options.shuffle:
            train = train.shuffle(seed=1, buffer_size=self.options.buffer)
        val, test = Generated(64, first=10**6), Generated(64, first=2 * 10**6)
        return api.Datasets(train=train, val=val, test=test)

    def collate(self, items: list[Any]) -> Any:
        """Rows (dicts) or readings (tuples) as (inputs, labels)."""
        if isinstance(items[0], dict):
            items = [(torch.tensor(row["x"]), row["y"]) for row in items]
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


TASK = AsIs
