"""Data: read raw files (read-only), write processed tensors, load them for training.

`prepare` turns `data/raw/` into one file `data/processed/<dataset>.pt` holding seeded
train/val/test splits as tensors; `train` and `evaluate` read only that file. To use your own
data set, set `data.dataset = "custom"` and fill in `read_custom` below: it returns all inputs
and integer labels, and everything downstream (splits, batching, training, evaluation) follows.
"""

import gzip
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import save_atomic
from .config import Config
from .errors import DataError
from .settings import Settings


@dataclass
class Split:
    """Inputs `x` (float32, N x ...) and integer labels `y` (int64, N)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        """Number of samples."""
        return len(self.y)


@dataclass
class Splits:
    """The three splits plus the class names."""

    train: Split
    val: Split
    test: Split
    classes: list[str]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample (without the batch dimension)."""
        return tuple(self.train.x.shape[1:])

    @property
    def nbytes(self) -> int:
        """Memory taken by all tensors."""
        parts = (self.train, self.val, self.test)
        return sum(t.element_size() * t.nelement() for s in parts for t in (s.x, s.y))


def read_digits(raw_dir: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The UCI optical digits: 1,797 rows of 64 pixel counts (0..16) and the digit label."""
    path = raw_dir / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"{path} not found: the digits example file is missing from data/raw")
    with gzip.open(path, "rt", encoding="ascii") as f:
        rows = [[float(v) for v in line.split(",")] for line in f if line.strip()]
    if not rows or any(len(r) != 65 for r in rows):
        raise DataError(f"{path}: expected rows of 64 pixels and a label")
    table = torch.tensor(rows)
    inputs = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    return inputs, table[:, 64].long(), [str(d) for d in range(10)]


def read_custom(raw_dir: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Your data set: read files under `raw_dir` and return (inputs, labels, class names).

    inputs: float tensor N x C x H x W (or N x F), labels: int64 tensor N with values in
    0..len(class names)-1. Read only; never write into `raw_dir`. Data too large for one
    tensor needs its own Dataset class; see `batches.py` for how batches are drawn.
    """
    raise DataError(
        f"data.dataset = 'custom' but read_custom() in {Path(__file__).name} is not written "
        f"yet: make it read your files from {raw_dir} and return (inputs, labels, classes)"
    )


READERS = {"digits": read_digits, "custom": read_custom}


def processed_path(cfg: Config, settings: Settings) -> Path:
    """Where `prepare` writes and `train` reads the processed data set."""
    return settings.processed_dir / f"{cfg.data.dataset}.pt"


def split_indices(n: int, val: float, test: float, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random partition of range(n) into train/val/test index tensors."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val, n_test = round(n * val), round(n * test)
    return {
        "val": order[:n_val],
        "test": order[n_val : n_val + n_test],
        "train": order[n_val + n_test :],
    }


def prepare(cfg: Config, settings: Settings) -> Path:
    """Read the raw data set, split it and write the processed file; return its path."""
    reader = READERS.get(cfg.data.dataset)
    if reader is None:
        raise DataError(f"data.dataset: unknown data set {cfg.data.dataset!r}; add it to READERS")
    inputs, labels, classes = reader(settings.raw_dir)
    if len(inputs) != len(labels) or len(labels) == 0:
        raise DataError(f"{cfg.data.dataset}: got {len(inputs)} inputs and {len(labels)} labels")
    parts = split_indices(
        len(labels), cfg.data.val_fraction, cfg.data.test_fraction, cfg.data.split_seed
    )
    payload = {
        name: {"x": inputs[idx].float().contiguous(), "y": labels[idx].long().contiguous()}
        for name, idx in parts.items()
    }
    payload["classes"] = classes
    out = processed_path(cfg, settings)
    save_atomic(payload, out)
    return out


def stage(path: Path, cfg: Config, local_rank: int) -> Path:
    """Inside a job, copy `path` to the node-local disk named by `data.node_tmp_var`.

    Shared file systems are slow for repeated reads from many GPUs; node-local disks are fast.
    Local rank 0 copies (atomically); the caller runs a barrier before the other ranks read.
    """
    node_tmp = os.environ.get(cfg.data.node_tmp_var, "")
    if not cfg.data.stage_to_node_tmp or not node_tmp or not Path(node_tmp).is_dir():
        return path
    target = Path(node_tmp) / "processed" / path.name
    if not path.is_file():
        raise DataError(f"{path} not found: run `prepare` first")
    source = path.stat()
    copied = target.stat() if target.exists() else None
    fresh = copied and (copied.st_size, copied.st_mtime_ns) == (source.st_size, source.st_mtime_ns)
    if local_rank == 0 and not fresh:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.copy2(path, tmp)  # keeps the modification time: the freshness check above
        tmp.replace(target)
        print(f"staged {path} -> {target}", file=sys.stderr)
    return target


def load_splits(path: Path) -> Splits:
    """Read a processed file written by `prepare`."""
    if not path.is_file():
        raise DataError(f"{path} not found: run `prepare` first")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    splits = {
        name: Split(payload[name]["x"], payload[name]["y"]) for name in ("train", "val", "test")
    }
    return Splits(**splits, classes=list(payload["classes"]))
