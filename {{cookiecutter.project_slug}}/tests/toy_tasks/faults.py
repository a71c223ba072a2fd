"""Every kind of stream over files outside data/processed, and the damage each file can take.

`task.kind` picks the train split, read from DATA_DIR/external/faults/<kind> (written by
`write_files`):
- "plain": raw rows read one by one, split across DataLoader workers by file with
  `get_worker_info()`, no state of its own (read whole by every process);
- "stateful": the same rows, a share per process and worker (`stream_part()`) and a state;
- "buffered": "stateful" through a `ShuffleBuffer`;
- "tar": WebDataset-style tar shards (`TarShards`), a row per sample;
- "hf" / "hf-own": parquet files through `hf_stream`, shuffled (replayed on resume) or not
  (its own state);
- "map": not a stream: a map-style data set that reads each row from its file on demand.
With `task.split=val` the kind's files are the validation split instead, and training reads
generated rows.
`damage` hurts one file of a kind the way a broken copy does: cut short (mid-row, or at a
tar member's boundary, which a reader must not take for the end) or, for parquet files that
carry page checksums, a flipped bit in their last data page. Each kind reads the damage after
some good steps (the map-style set's one cut row comes in a random batch).
"""

import struct
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from under_test import pkg

api = pkg("api")
ROW = struct.Struct("<9f")  # 8 inputs and the label, as float32
FILES, ROWS = 4, 96  # per kind; the rows of file i are i, i + FILES, ...
KINDS = ("plain", "stateful", "buffered", "tar", "hf", "hf-own", "map")


def reading(i: int) -> tuple[torch.Tensor, int]:
    """Sample number `i`: 8 channels, labelled by the sign of their sum."""
    x = torch.randn(8, generator=torch.Generator().manual_seed(i))
    return x, int(x.sum() > 0)


def rows_of(i: int) -> list[tuple[torch.Tensor, int]]:
    return [reading(j) for j in range(i, FILES * ROWS, FILES)]


def folder(data_dir: Path, kind: str) -> Path:
    return data_dir / "external" / "faults" / kind


def write_files(data_dir: Path, kind: str) -> list[Path]:
    """The files a kind reads, written whole."""
    out = folder(data_dir, kind)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "tar":
        samples = (
            {"__key__": f"{j:06d}", "row": ROW.pack(*x.tolist(), y)}
            for i in range(FILES)
            for j, (x, y) in enumerate(rows_of(i), start=i * ROWS)
        )
        return api.write_tar_shards(samples, out, "rows", ROWS)
    paths = []
    for i in range(FILES):
        rows = rows_of(i)
        if kind.startswith("hf"):
            import pyarrow as pa  # noqa: PLC0415  (the datasets extra)
            import pyarrow.parquet as pq  # noqa: PLC0415

            table = pa.table({"x": [x.tolist() for x, _ in rows], "y": [y for _, y in rows]})
            paths.append(out / f"rows-{i}.parquet")
            pq.write_table(table, paths[-1], row_group_size=16, write_page_checksum=True)
        else:
            paths.append(out / f"rows-{i}.bin")
            paths[-1].write_bytes(b"".join(ROW.pack(*x.tolist(), y) for x, y in rows))
    return paths


def damage(data_dir: Path, kind: str) -> Path:
    """Hurt the last file of `kind` two thirds in; return its path."""
    files = sorted(folder(data_dir, kind).iterdir())
    path, data = files[-1], bytearray(files[-1].read_bytes())
    if kind == "tar":  # cut at the header of a member two thirds in: no end-of-archive marker
        with tarfile.open(path) as tar:
            cut = tar.getmembers()[2 * ROWS // 3].offset
        path.write_bytes(bytes(data[:cut]))
    elif kind.startswith("hf"):  # a bit flipped in the last row group's data page
        import pyarrow.parquet as pq  # noqa: PLC0415  (the datasets extra)

        column = pq.read_metadata(path).row_group(ROWS // 16 - 1).column(0)
        start = column.dictionary_page_offset or column.data_page_offset  # the chunk's first page
        at = start + column.total_compressed_size - 8  # the end of its (last) data page
        data[at] ^= 0x10
        path.write_bytes(bytes(data))
    elif kind == "map":  # cut inside the last row: one sample, read at a random step
        path.write_bytes(bytes(data[: len(data) - ROW.size // 2]))
    else:  # cut inside a row
        path.write_bytes(bytes(data[: 2 * len(data) // 3 + 5]))
    return path


def decode_row(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    values = ROW.unpack(sample["row"])
    return torch.tensor(values[:8]), int(values[8])


def from_row(row: dict[str, Any]) -> tuple[torch.Tensor, int]:
    # No pause at the end of a shuffled pass (see toy_tasks/streams.py), set in the worker.
    sys.modules["datasets.config"].SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    return torch.tensor(row["x"]), row["y"]


def read_rows(path: Path, skip: int = 0) -> Iterator[tuple[torch.Tensor, int]]:
    """A file's rows from row `skip` on; a cut row fails as struct does, naming no file."""
    with path.open("rb") as f:
        f.seek(skip * ROW.size)
        while chunk := f.read(ROW.size):
            yield decode_row({"row": chunk})


class Plain(IterableDataset):
    """Each DataLoader worker reads every num_workers-th file; no state."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for path in self.files[worker::workers]:
            yield from read_rows(path)


class Stateful(IterableDataset):
    """This part's files (`stream_part()`), with a state: the file and the rows done in it."""

    def __init__(self, files: list[Path]) -> None:
        self.files, self.at, self.start = files, (0, 0), (0, 0)

    def state_dict(self) -> dict[str, int]:
        return {"file": self.at[0], "row": self.at[1]}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = (state["file"], state["row"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        part = api.stream_part()
        mine = self.files[part.index :: part.count]
        first, skip = self.start
        self.start = (0, 0)
        for i in range(first, len(mine)):
            for done, row in enumerate(read_rows(mine[i], skip if i == first else 0), 1):
                self.at = (i, (skip if i == first else 0) + done)
                yield row
            self.at = (i + 1, 0)


class Rows(torch.utils.data.Dataset):
    """Row i of the data set is row i // FILES of file i % FILES, read when asked for."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return FILES * ROWS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with self.files[i % FILES].open("rb") as f:
            f.seek(i // FILES * ROW.size)
            return decode_row({"row": f.read(ROW.size)})  # past a cut: struct.error


class Generated(IterableDataset):
    """`n` generated rows from number `first` on, read whole by every process."""

    def __init__(self, n: int, first: int) -> None:
        self.n, self.first = n, first

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(worker, self.n, workers):
            yield reading(self.first + i)


@dataclass
class Options:
    kind: str = "plain"  # see the module
    split: str = "train"  # or "val": the split that reads the kind's files


class Faults(api.Classification):
    Options = Options
    classes = ("negative", "positive")

    def datasets(self, data_dir: Path) -> Any:
        kind, seed = self.options.kind, self.cfg.run.seed
        files = sorted(folder(self.settings.data_dir, kind).iterdir())
        if kind == "tar":
            train: Any = api.TarShards(files, decode_row, seed=seed)
        elif kind.startswith("hf"):
            buffer = 16 if kind == "hf" else 0
            train = api.hf_stream(files, shuffle_buffer=buffer, seed=seed, transform=from_row)
        elif kind == "plain":
            train = Plain(files)
        elif kind == "map":
            train = Rows(files)
        else:
            train = Stateful(files)
            train = api.ShuffleBuffer(train, 16, seed=seed) if kind == "buffered" else train
        val = Generated(32, first=10**6)
        if self.options.split == "val":
            train, val = Generated(FILES * ROWS, first=0), train
        return api.Datasets(train=train, val=val, test=Generated(32, first=10**6))

    def build_model(self) -> nn.Module:
        return api.build_model(self.cfg.model, (8,), 2)


TASK = Faults
