"""The files of a sharded checkpoint: DCP's storage, checked by digest as it is written and read.

torch.distributed.checkpoint (DCP) writes and reads through a file system object and a
reader; these are DCP's own for local and network disks, with changes that make checkpoints
cost what the disk costs and no more (benchmarks/bench_checkpoint.py profiles both):

- Writing: each file's digest (checkpoint.DIGEST) is computed on the bytes in hand as they go
  to the file, so a save never reads its files back to checksum them (that was 1.8 of 4
  thread-seconds of a sharded save on 2 cores), and torch's per-record CRC-32 is off.
- Reading: DCP reads a process's files one after another; here READ_THREADS read them at once,
  each in file order, and each file's digest is taken on the bytes DCP reads (CheckedFile),
  so every byte is read once. Verifying in threads beside DCP's had copied every byte out
  of the page cache a second time: a quarter of a load on 2 processes and 2 cores. A file
  that does not match fails the load in one line (also when torch.load failed on it first);
  what was read into the model is not used: the next older checkpoint is loaded over it, or
  the run stops (NoIntactCheckpointError).
"""

import io
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from ...errors import CheckpointError
from . import checkpoint

# DCP writes a process's shards with one thread by default: 0.40-0.45 GB/s on an H200 node's
# disk that takes 1.4 GB/s. With WRITE_THREADS threads each process writes that many files in
# parallel.
WRITE_THREADS = 4


class DigestedFiles(FileSystem):
    """DCP's local file system, recording the digest of each file written through it.

    `written`: {file name: digest}, under the files' final names.
    """

    def __init__(self) -> None:
        """Nothing written yet."""
        super().__init__()
        self.written: dict[str, str] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        """A file to write, digested as it goes (to read: DCP's own)."""
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        with path.open(mode) as f, checkpoint.without_zip_crc():
            stream = checkpoint.DigestingFile(f)
            yield stream
        self.written[path.name] = stream.hexdigest()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        """Rename a file, its digest following it (DCP writes its metadata under a temp name)."""
        super().rename(path, new_path)
        self.written[Path(new_path).name] = self.written.pop(Path(path).name)


class CheckedFile:
    """A checkpoint file as DCP reads it, digested from the bytes DCP reads.

    The digest needs the file's bytes in order; torch.load reads each record's index at the
    end of the record first. So bytes at the digest's position are digested as they arrive
    (a tensor's data: no second pass through the page cache); a small piece ahead of it is
    kept until the position reaches it, and what DCP skips (zip headers, records of other
    processes) is read here. `check()` reads what is left and compares.
    What DCP and torch.load use of a file: read, readinto, readline, seek, tell.
    """

    KEEP = 1 << 20  # pieces ahead of the position up to this size are kept, larger ones wait

    def __init__(self, f: io.BufferedReader, expected: str, algorithm: str) -> None:
        """Wrap the open file `f`, whose digest with `algorithm` must be `expected`."""
        self.f, self.expected = f, expected
        self.digest, self.pos = checkpoint.hasher(algorithm), 0
        self.ahead: dict[int, bytes] = {}  # offset: a piece read before the position got there

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to `offset`."""
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        """The position in the file."""
        return self.f.tell()

    def readable(self) -> bool:
        """Readable, as a file opened to read."""
        return True

    def seekable(self) -> bool:
        """Seekable, as a file on a disk."""
        return True

    def read(self, size: int = -1) -> bytes:
        """Read up to `size` bytes (all with -1)."""
        at = self.f.tell()
        data = self.f.read(size)
        self._saw(at, memoryview(data))
        return data

    def readline(self, size: int = -1) -> bytes:
        """Read a line (pickle asks for some)."""
        at = self.f.tell()
        data = self.f.readline(size)
        self._saw(at, memoryview(data))
        return data

    def readinto(self, buffer: Any) -> int:
        """Read into `buffer` (a tensor's storage when torch.load reads its data)."""
        at = self.f.tell()
        count = self.f.readinto(buffer)
        self._saw(at, memoryview(buffer).cast("B")[:count])
        return count

    def _saw(self, at: int, data: memoryview) -> None:
        """Take bytes read at offset `at` into the digest, or keep them until it gets there."""
        if at + len(data) <= self.pos:
            return  # read again: digested already
        if at > self.pos:
            if len(data) <= self.KEEP:
                self.ahead[at] = bytes(data)  # what it leaves out is read by _fill
                return
            self._fill(at)
        self._feed(data[self.pos - at :])

    def _feed(self, data: memoryview | bytes) -> None:
        """Digest `data`, which starts at the position, then what was kept for after it."""
        self.digest.update(data)
        self.pos += len(data)
        while self.ahead and (at := min(self.ahead)) <= self.pos:
            piece = self.ahead.pop(at)
            if at + len(piece) > self.pos:
                self.digest.update(piece[self.pos - at :])
                self.pos = at + len(piece)

    def _fill(self, until: int) -> None:
        """Digest everything before offset `until`: kept pieces, the rest read here."""
        while self.pos < until:
            stop = min([until, *self.ahead])  # every kept piece lies past the position
            gap = os.pread(self.f.fileno(), min(stop - self.pos, 8 << 20), self.pos)
            if not gap:
                raise CheckpointError(f"{self.f.name}: cut short while it was read")
            self._feed(gap)

    def check(self) -> str | None:
        """Why the file does not match the manifest, once all of it is digested; None if it does."""
        self._fill(os.fstat(self.f.fileno()).st_size)
        if self.digest.hexdigest() != self.expected:
            return f"{self.f.name}: checksum mismatch (damaged or changed after it was written)"
        return None


def checker(name: str, world_size: int) -> int | None:
    """The process that checks file `name` of a sharded checkpoint in full; None: each reader.

    DCP names a process's data files `__<rank>_<n>.distcp`. Each is checked by the process of
    that rank (modulo the processes now), which reads most of it when the number of processes
    is unchanged; a process reading a few records of another's file (DCP writes a tensor all
    processes hold once) leaves that file to its checker. Other files (`.metadata`) are small
    and checked by every process that reads them.
    """
    found = re.fullmatch(r"__(\d+)_\d+\.distcp", name)
    return None if found is None else int(found[1]) % world_size


class _CheckedFiles(FileSystem):
    """DCP's local file system whose files opened to read are checked against a manifest.

    `problem`: the line of the first file that did not match, also raised as CheckpointError
    (which DCP wraps in its own exception). `opened`: the names of the files opened so far.
    """

    def __init__(self, manifest: dict[str, Any], rank: int, world_size: int) -> None:
        super().__init__()
        self.manifest, self.problem, self.opened = manifest, "", set[str]()
        self.rank, self.world_size = rank, world_size

    def mine(self, name: str) -> bool:
        """Whether this process checks file `name` whole (see `checker`)."""
        return checker(name, self.world_size) in (None, self.rank)

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], _mode: str) -> Iterator[Any]:
        """A file to read (DCP's reader only reads), checked once DCP is done with it or failed.

        A file this process does not check whole (`mine`) is read as it is, and checked only
        when reading it failed: a damaged file is named by its checksum, not by torch.load.
        """
        path = Path(path)
        if (expected := self.manifest["files"].get(path.name)) is None:
            self._refuse(f"{path}: not in the checkpoint's checksum record")
        self.opened.add(path.name)
        mine = self.mine(path.name)
        with path.open("rb") as f:
            if mine and hasattr(os, "posix_fadvise"):  # not on macOS
                # All of it will be read: the disk reads ahead while torch.load unpacks
                # (without, the load of a 128 MB sample took 0.1 or 0.2 s by chance).
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            stream = CheckedFile(f, expected, self.manifest["algorithm"])
            try:
                yield stream if mine else f
            except Exception as err:
                if problem := stream.check():  # what it did not read, it reads now
                    self._refuse(problem, err)
                raise
            if mine and (problem := stream.check()):
                self._refuse(problem)

    def unread(self) -> list[str]:
        """The data files this process checks whole (`checker`) but has not opened."""
        files, rank = self.manifest["files"], self.rank
        return [f for f in files if f not in self.opened and checker(f, self.world_size) == rank]

    def _refuse(self, problem: str, cause: BaseException | None = None) -> NoReturn:
        self.problem = self.problem or problem
        raise CheckpointError(problem) from cause


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, reading a process's files in parallel, each checked as it is read."""

    def __init__(self, path: Path, manifest: dict[str, Any], rank: int, world_size: int) -> None:
        super().__init__(path)
        self.fs = self.checked = _CheckedFiles(manifest, rank, world_size)

    @property
    def problem(self) -> str:
        """The line of the first file that did not match ("" while none)."""
        return self.checked.problem

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the plan's items file by file in file order, files in parallel.

        Then this process's files it did not read are checked (with another number of
        processes than wrote them).
        """
        by_file: dict[str, list[Any]] = defaultdict(list)
        for item in plan.items:
            by_file[self.storage_data[item.storage_index].relative_path].append(item)

        def read(items: list[Any]) -> None:
            items.sort(key=lambda item: self.storage_data[item.storage_index].offset)
            super(_Reader, self).read_data(LoadPlan(items), planner).wait()

        def check(name: str) -> None:
            with self.fs.create_stream(Path(self.path) / name, "rb"):
                pass  # nothing read: the check reads it all

        with ThreadPoolExecutor(checkpoint.READ_THREADS, thread_name_prefix="load") as pool:
            for done in [pool.submit(read, items) for items in by_file.values()]:
                done.result()
            for done in [pool.submit(check, name) for name in self.checked.unread()]:
                done.result()
        finished: Future[None] = Future()
        finished.set_result(None)
        return finished


def writer(folder: Path) -> dcp.FileSystemWriter:
    """DCP's file writer for `folder`: WRITE_THREADS files per process, digested as written.

    The digests are in `writer(...).fs.written` once the save has finished.
    """
    out = dcp.FileSystemWriter(folder, thread_count=WRITE_THREADS)
    out.fs = DigestedFiles()
    return out


def reader(folder: Path, manifest: dict[str, Any], rank: int, world_size: int) -> _Reader:
    """DCP's file reader for checkpoint `folder`, checking files against its `manifest`.

    Process `rank` of `world_size` checks the files `checker` gives it, and the small ones.

    `reader(...).problem`: the line of a file that did not match, once the load failed.
    """
    return _Reader(folder, manifest, rank, world_size)
