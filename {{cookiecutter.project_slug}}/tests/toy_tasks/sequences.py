"""Variable-length token sequences: dynamic padding and a mask in the task's own `collate`.

A sample is (tokens, label) with 4 to `max_len` token ids; the label says whether most tokens
are in the lower half of the vocabulary. `collate` pads each batch to its own longest sample
(not to the longest of the data set) and adds a mask, and the model averages the embeddings
of the real tokens only. Random token dropout in `__getitem__` exercises seeded augmentation.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from under_test import pkg

Classification = pkg("task_kinds").Classification
Datasets = pkg("task").Datasets


class Sequences(Dataset):
    """Token sequences of different lengths, one random token dropped per load (augmentation)."""

    def __init__(self, n: int, vocab: int, max_len: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, max_len + 1, (n,), generator=g)
        self.tokens = [torch.randint(0, vocab, (int(k),), generator=g) for k in lengths]
        self.labels = [int((t < vocab // 2).float().mean() > 0.5) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        tokens = self.tokens[i]
        drop = int(torch.randint(0, len(tokens), ()))
        return torch.cat([tokens[:drop], tokens[drop + 1 :]]), self.labels[i]


class MeanOfEmbeddings(nn.Module):
    """Embeddings averaged over the real (unmasked) tokens, then a linear classifier."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, 2)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, mask = inputs
        weights = mask.unsqueeze(-1).float()
        pooled = (self.embed(tokens) * weights).sum(1) / weights.sum(1)
        return self.head(pooled)


@dataclass
class Options:
    n: int = 400
    vocab: int = 16
    max_len: int = 24


class TokenTask(Classification):
    Options = Options

    def datasets(self, data_dir: Path) -> Any:
        del data_dir  # made in memory
        o = self.options
        self.classes = ["upper", "lower"]
        sizes = {"train": o.n, "val": o.n // 4, "test": o.n // 4}
        return Datasets(
            **{
                k: Sequences(n, o.vocab, o.max_len, seed=i)
                for i, (k, n) in enumerate(sizes.items())
            }
        )

    def collate(self, samples: list[Any]) -> Any:
        """Pad to the longest sample of this batch; the mask marks the real tokens."""
        longest = max(len(tokens) for tokens, _ in samples)
        tokens = torch.zeros(len(samples), longest, dtype=torch.long)
        mask = torch.zeros(len(samples), longest, dtype=torch.bool)
        for row, (sample, _) in enumerate(samples):
            tokens[row, : len(sample)] = sample
            mask[row, : len(sample)] = True
        labels = torch.tensor([label for _, label in samples])
        return (tokens, mask), labels

    def build_model(self) -> nn.Module:
        return MeanOfEmbeddings(self.options.vocab, self.cfg.model.hidden)


TASK = TokenTask
