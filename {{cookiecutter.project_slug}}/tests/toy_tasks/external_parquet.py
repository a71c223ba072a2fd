"""A stream over parquet files in DATA_DIR/external/corpus, read as the guide reads them.

The `corpus` task of docs/bring-your-own-task.md ('Streams') in small: nothing to prepare,
the train split shuffled by `hf_stream` from the files another group handed over (copied in
by the user, outside data/processed), and one line naming the folder when none are there.
"""

from pathlib import Path
from typing import Any

import torch
from torch import nn

from under_test import pkg

api = pkg("api")


def to_sample(row: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return torch.tensor(row["x"]), row["y"]


class ExternalParquet(api.Classification):
    classes = ("negative", "positive")

    def datasets(self, data_dir: Path) -> Any:
        folder = self.settings.data_dir / "external" / "corpus"
        if not (files := sorted(folder.glob("*.parquet"))):
            raise api.DataError(f"{folder}: no parquet files")
        train = api.hf_stream(files, shuffle_buffer=64, seed=self.cfg.run.seed, transform=to_sample)
        held_out = api.hf_stream(files[:1], transform=to_sample)
        return api.Datasets(train=train, val=held_out, test=held_out)

    def build_model(self) -> nn.Module:
        return api.build_model(self.cfg.model, (8,), 2)


TASK = ExternalParquet
