"""WebDataset-style tar shards: written by `prepare`, read as a stream that resumes exactly.

A shard is a plain tar file; a sample is the run of consecutive members that share a key (the
name up to the first dot of its last part), one member per field: `000042.npy`, `000042.cls`
is the sample `{"__key__": "000042", "npy": ..., "cls": ...}`. Shards written by other groups
in this layout (WebDataset's) are read as they are.

The reader walks the tar headers itself, from a memory map, front to back: the standard
library's `tarfile` costs about 40 microseconds a member in Python (`benchmarks/
bench_stream.py` measures the reader against reading the files' bytes raw). The shards are
written with `tarfile`. `webdataset` itself is
not used: it keeps no position, and its splits and seeds change with the worker count, where
exact resume needs both fixed. Each copy of the stream reads whole shards: every epoch the
shards are put in an order seeded by (seed, epoch), the same in every process, and part p of
n takes shards p, p + n, ... Its state is the shard and the samples done in it; a resume
opens that shard and skips those samples (no other shard is read).
"""

import io
import mmap
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset

from ..errors import DataError, first_line
from .streams import stream_part

Sample = dict[str, Any]


def _key(name: str) -> tuple[str, str]:
    """(key, field) of a member name: `dir/000042.seg.png` -> (`dir/000042`, `seg.png`)."""
    folder, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return f"{folder}/{stem}" if folder else stem, field


BLOCK = 512
REGULAR = (b"0", b"\0", b"7")  # regular files (7: contiguous, read alike)
# A name that is not UTF-8 (an old archive; bytes that are no tar) is read as `tarfile` reads it.
ESCAPE = "surrogateescape"


def _octal(field: bytes, path: Path, offset: int) -> int:
    """A numeric header field (octal text, or base-256 for large sizes)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise DataError(f"{path}: not a tar file, or damaged at byte {offset}") from None


def _pax(body: bytes) -> dict[str, str]:
    """The records of a pax extended header: each is its length, a space, key=value, newline."""
    records, pos = {}, 0
    while pos < len(body) and body[pos : pos + 1] != b"\0":
        length = int(body[pos : body.index(b" ", pos)])
        key, _, value = body[body.index(b" ", pos) + 1 : pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode()
        pos += length
    return records


def _cut_short(path: Path, end: int, why: str) -> DataError:
    """The one line for a shard that ends before its tar does."""
    return DataError(f"{path}: cut short at byte {end} ({why}: an interrupted download or copy?)")


def _members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular file of a tar, in order, headers checked.

    The standard library's `tarfile` spends about 40 microseconds on each member's header in
    Python; a shard of small samples holds hundreds of thousands. This reads ustar, GNU long
    names and pax paths from a memory map and skips everything that is not a regular file.
    Header checksums are not summed (half the time per member): a damaged number or a size
    past the end stops with one line, and the files' bytes are checked whole by their
    SHA-256 (processed data's SHA256SUMS, or the data digest of a stream's source files).

    A shard must end where a tar ends, at its end-of-archive marker: a shard cut at a member's
    boundary still has whole headers, and read up to "no more headers" (as GNU tar and
    `tarfile` read it, without a word) it would pass for a shorter shard. The marker is two
    zero blocks; one is enough here. Some writers end with one (GNU tar reads such archives
    and warns of "a lone zero block"), and one zero block already shows that every member
    before it is whole: a copy cut inside the second block has lost no sample. What follows
    the marker (the padding to a whole record) is not read, so a cut there reads whole.
    """
    if path.stat().st_size == 0:  # (mmap refuses an empty file)
        raise DataError(f"{path}: 0 bytes, not a tar file (an interrupted download or copy?)")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos, end, long_name = 0, len(m), ""
        pax: dict[str, str] = {}
        while pos + BLOCK <= end:
            header = m[pos : pos + BLOCK]
            if header[:1] == b"\0" and header.count(0) == BLOCK:  # the end-of-archive marker
                return
            size = int(pax["size"]) if "size" in pax else _octal(header[124:136], path, pos)
            kind, start = header[156:157], pos + BLOCK
            pos = start + -(-size // BLOCK) * BLOCK
            if pos > end:
                raise _cut_short(path, end, f"the member at byte {start - BLOCK} runs past it")
            if kind == b"L":  # GNU: the next member's long name
                long_name = m[start : start + size].split(b"\0", 1)[0].decode(errors=ESCAPE)
            elif kind == b"x":  # pax: records for the next member
                try:
                    pax = _pax(m[start : start + size])
                except (ValueError, UnicodeDecodeError):  # a length or text that is not
                    raise DataError(f"{path}: a damaged pax header at byte {start}") from None
            elif kind in REGULAR:  # (an old folder is a regular file whose name ends in /)
                name = pax.get("path") or long_name or _name(header)
                if not name.endswith("/"):
                    yield name, m[start : start + size]
                long_name, pax = "", {}
            else:  # folders, links, global headers: no sample data
                long_name, pax = "", {}
        raise _cut_short(path, end, "no end-of-archive marker")


def _name(header: bytes) -> str:
    """A ustar header's path: its prefix field, then its name field."""
    name = header[:100].split(b"\0", 1)[0].decode(errors=ESCAPE)
    if header[257:262] == b"ustar" and (prefix := header[345:500].split(b"\0", 1)[0]):
        return f"{prefix.decode(errors=ESCAPE)}/{name}"
    return name


def read_tar(path: Path) -> Iterator[Sample]:
    """The samples of one shard, in file order, each a dict of field -> bytes plus `__key__`."""
    sample: Sample = {}
    for name, data in _members(path):
        key, field = _key(name)
        if sample and sample["__key__"] != key:
            yield sample
            sample = {}
        sample.setdefault("__key__", key)
        sample[field] = data
    if sample:
        yield sample


def write_tar_shards(
    samples: Iterable[Mapping[str, Any]], out_dir: Path, prefix: str, per_shard: int
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

    `decode` turns a sample's bytes into what the task trains on; it runs in the workers. An
    error it raises ends the stream as one line naming the shard and the sample's key.
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
                try:
                    decoded = self.decode(sample)
                except Exception as err:  # a bad image, a wrong byte count: name the sample
                    where = f"{shards[shard]}: sample {sample['__key__']}"
                    raise DataError(f"{where}: {first_line(err)}") from err
                yield decoded
            self.position = (shard + 1, 0)
