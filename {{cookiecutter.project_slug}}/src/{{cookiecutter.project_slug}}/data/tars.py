"""WebDataset-style tar shards: written by `prepare`, read as a stream that resumes exactly.

A shard is a plain tar file; a sample is the run of consecutive members that share a key (the
name up to the first dot of its last part), one member per field: `000042.npy`, `000042.cls`
is the sample `{"__key__": "000042", "npy": ..., "cls": ...}`. Shards written by other groups
in this layout (WebDataset's) are read as they are.

The reader is the standard library's `tarfile`, read front to back (`benchmarks/
bench_stream.py` measures it against reading the files' bytes raw). `webdataset` itself is
not used: it keeps no position, and its splits and seeds change with the worker count, where
exact resume needs both fixed. Each copy of the stream reads whole shards: every epoch the
shards are put in an order seeded by (seed, epoch), the same in every process, and part p of
n takes shards p, p + n, ... Its state is the shard and the samples done in it; a resume
opens that shard and skips those samples (no other shard is read).
"""

import io
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset

from ..errors import DataError
from .streams import stream_part

Sample = dict[str, Any]


def _key(name: str) -> tuple[str, str]:
    """(key, field) of a member name: `dir/000042.seg.png` -> (`dir/000042`, `seg.png`)."""
    folder, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return f"{folder}/{stem}" if folder else stem, field


def read_tar(path: Path) -> Iterator[Sample]:
    """The samples of one shard, in file order, each a dict of field -> bytes plus `__key__`."""
    sample: Sample = {}
    with tarfile.open(path, "r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, field = _key(member.name)
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            handle = tar.extractfile(member)
            assert handle is not None  # a regular file
            sample.setdefault("__key__", key)
            sample[field] = handle.read()
    if sample:
        yield sample


def write_tar_shards(
    samples: Iterable[Mapping[str, bytes]], out_dir: Path, prefix: str, per_shard: int
) -> list[Path]:
    """Write samples (`__key__` and field -> bytes) into `prefix-000000.tar`, ... of `per_shard`.

    Members carry no owner, time or mode of the machine, so the same samples give the same
    bytes (and digests) on every machine.
    """
    paths: list[Path] = []
    source = iter(samples)
    while chunk := list(islice(source, per_shard)):  # one shard's samples at a time
        paths.append(out_dir / f"{prefix}-{len(paths):06d}.tar")
        with tarfile.open(paths[-1], "w", format=tarfile.USTAR_FORMAT) as tar:
            for sample in chunk:
                for field, data in sample.items():
                    if field != "__key__":
                        info = tarfile.TarInfo(f"{sample['__key__']}.{field}")
                        info.size, info.mode = len(data), 0o444
                        tar.addfile(info, io.BytesIO(data))
    return paths


class TarShards(IterableDataset):
    """The samples of tar shards as a stream: whole shards per part, a position per copy.

    `decode` turns a sample's bytes into what the task trains on; it runs in the workers.
    """

    def __init__(self, files: list[Path], decode: Callable[[Sample], Any], seed: int = 0) -> None:
        """Read `files` (every epoch in a seeded order); decode each sample with `decode`."""
        if not files:
            raise DataError("TarShards: no tar files given (did prepare write any?)")
        self.files, self.decode, self.seed, self.epoch = sorted(files), decode, seed, 0
        self.position = (0, 0)  # (shard of this part, samples done in it)
        self._start: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: it seeds the shards' order."""
        self.epoch = epoch

    def source_files(self) -> list[Path]:
        """The shards (for the data digest in checkpoints)."""
        return list(self.files)

    def state_dict(self) -> dict[str, int]:
        """The shard being read (among this part's) and the samples already yielded from it."""
        return {"shard": self.position[0], "sample": self.position[1]}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from `state` at the next `iter`."""
        self._start = (int(state["shard"]), int(state["sample"]))

    def mine(self) -> list[Path]:
        """This part's shards for the current epoch."""
        part = stream_part()
        if len(self.files) < part.count:
            raise DataError(
                f"{len(self.files)} tar shard(s) for {part.world} process(es) x {part.workers} "
                "worker(s): every worker reads whole shards, so write more (smaller) shards "
                "in prepare, or set data.num_workers lower"
            )
        order = torch.randperm(
            len(self.files), generator=torch.Generator().manual_seed(self.seed + self.epoch)
        )
        return [self.files[i] for i in order[part.index :: part.count].tolist()]

    def __iter__(self) -> Iterator[Any]:
        """Decoded samples of this part's shards, from the saved position on."""
        start, self._start = self._start or (0, 0), None
        shards = self.mine()
        for shard in range(start[0], len(shards)):
            skip = start[1] if shard == start[0] else 0
            for done, sample in enumerate(read_tar(shards[shard]), 1):
                if done <= skip:
                    continue
                self.position = (shard, done)
                yield self.decode(sample)
            self.position = (shard + 1, 0)
