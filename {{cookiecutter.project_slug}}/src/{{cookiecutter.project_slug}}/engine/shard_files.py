"""The files of a sharded checkpoint: DCP's storage, checked by digest as it is written and read.

torch.distributed.checkpoint (DCP) writes and reads through a file system object and a
reader; these are DCP's own for local and network disks, with changes that make checkpoints
cost what the disk costs and no more (benchmarks/bench_checkpoint.py profiles both):

- Writing: each file's digest (checkpoint.DIGEST) is computed on the bytes in hand as they go
  to the file, so a save never reads its files back to checksum them (that was 1.8 of 4
  thread-seconds of a sharded save on 2 cores), and torch's per-record CRC-32 is off.
- Reading: DCP reads a process's files one after another; here READ_THREADS read them at once
  while one more thread verifies them against the manifest. Both reach the same pages, so the
  disk is read once (whichever comes second finds them in the cache), where verifying first
  and loading after read it twice. A file that does not match fails the load in one line;
  what was read into the model is not used: the next older checkpoint is loaded over it, or
  the run stops (NoIntactCheckpointError).
"""

import os
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from ..errors import CheckpointError
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


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, reading a process's files in parallel, checked alongside.

    `problem`: the line of a file that did not match (DCP wraps the error it raises).
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        super().__init__(path)
        self.manifest, self.problem = manifest, ""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the plan's items file by file, files in parallel, while checking the files."""
        by_file: dict[str, list[Any]] = defaultdict(list)
        for item in plan.items:
            by_file[self.storage_data[item.storage_index].relative_path].append(item)

        def read(items: list[Any]) -> None:
            super(_Reader, self).read_data(LoadPlan(items), planner).wait()

        names = sorted({*by_file, ".metadata"})
        with ThreadPoolExecutor(checkpoint.READ_THREADS + 1, thread_name_prefix="load") as pool:
            checked = pool.submit(checkpoint.damaged, Path(self.path), self.manifest, names)
            loads = [pool.submit(read, items) for items in by_file.values()]
            if problem := checked.result():
                self.problem = problem
                raise CheckpointError(problem)
            for done in loads:
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


def reader(folder: Path, manifest: dict[str, Any]) -> _Reader:
    """DCP's file reader for checkpoint `folder`, checking each file against its `manifest`."""
    return _Reader(folder, manifest)
