"""A failure while reading data, as one line that names the file, sent from the worker as data.

An exception raised in a DataLoader worker reaches the training process as a copy whose
message carries the worker's whole traceback ("Caught X in DataLoader worker process N ...
Original Traceback"), and what it says often names no file: pyarrow says `'<Buffer>'`, numpy
and PIL name nothing. So the code that reads a batch (a stream's feed, a map-style data set's
batch) catches the exception where it happens and sends a `ReadFailure` in place of the batch:
the cause in one line, the file the reader opened last (where the cause names none), the
worker and the process, and the traceback as text for the run's log. The training process
then stops where every process agrees (`engine.loop.stream_batches`, `engine.loop.batches`), with a
checkpoint of the last good step.

The files opened are seen by a Python audit hook on the `open` event (PEP 578), active only
while a batch is being read: it sees what plain `open`, `pathlib`, numpy, PIL and `datasets`
(through fsspec) open, so a reader names its file without being written for it. pyarrow's own
C++ reads raise no event, but `datasets` opens each file in Python first. Files of Python
itself and of installed packages (modules imported while reading) are not data and are skipped.
The file opened last is not always the one that failed (a reader may interleave files), so
the line says "last file opened"; a reader that knows better checks the files it opened
(`opened`) and names the damaged one itself (`hf_stream` does).
"""

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import get_worker_info

from ..errors import DataError, first_line

KEPT = 64  # the files a process opened last, newest first, for a reader to check
# Opened while reading, yet not data: code, and files below Python's own folders.
_NOT_DATA_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_NOT_DATA_FOLDERS = tuple({str(Path(p)) + os.sep for p in (sys.prefix, sys.base_prefix)})


@dataclass(frozen=True)
class ReadFailure:
    """What went wrong while a batch was read, and where: plain data, sent between processes."""

    cause: str  # one line: a DataError's own message, else "<type>: <first line>"
    file: str  # the file the reader opened last ("" when none was opened)
    worker: int | None  # the DataLoader worker; None: the training process read it itself
    rank: int  # the training process
    traceback: str  # the whole traceback, for the run's log

    def line(self) -> str:
        """The cause, the file where the cause does not name it, the worker and the process."""
        named = not self.file or self.file in self.cause
        reading = "" if named else f" (last file opened: {self.file})"
        if self.worker is None:
            return f"{self.cause}{reading}, in process {self.rank}"
        return f"{self.cause}{reading}, in DataLoader worker {self.worker} of process {self.rank}"


class ReadError(DataError):
    """A batch could not be read: `failure` says why and where (None: another process's).

    Raised in the training process, where a `ReadFailure` arrived in place of a batch, and
    again, on every process, where the processes agreed to stop.
    """

    def __init__(self, failure: ReadFailure | None) -> None:
        """Carry `failure`; the message is its line."""
        super().__init__(failure.line() if failure else "the data failed on another process")
        self.failure = failure


@dataclass
class _Watch:
    """The audit hook's state in this process (one per process, installed once)."""

    installed: bool = False
    active: bool = False
    opened: dict[str, None] = field(default_factory=dict)  # oldest first, at most KEPT


_watch = _Watch()


def _on_event(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: keep the path of each file opened while a batch is read."""
    if event != "open" or not _watch.active:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    data = isinstance(path, str) and not path.endswith(_NOT_DATA_SUFFIXES)
    if data and not path.startswith(_NOT_DATA_FOLDERS):
        _watch.opened.pop(path, None)  # a file opened again is the newest again
        _watch.opened[path] = None
        if len(_watch.opened) > KEPT:
            del _watch.opened[next(iter(_watch.opened))]


def opened() -> list[str]:
    """The data files this process opened while reading batches (the last `KEPT`), newest first."""
    return list(reversed(_watch.opened))


@contextmanager
def reading() -> Iterator[None]:
    """While inside, the data files this process opens are kept (see `opened`)."""
    if not _watch.installed:  # audit hooks cannot be removed: one per process, gated
        sys.addaudithook(_on_event)
        _watch.installed = True
    outer, _watch.active = _watch.active, True
    try:
        yield
    finally:
        _watch.active = outer


def kind(err: BaseException) -> str:
    """The error's type, with its module unless built in (`struct.error`, not `error`)."""
    module = type(err).__module__
    return type(err).__qualname__ if module == "builtins" else f"{module}.{type(err).__qualname__}"


def caught(err: BaseException, rank: int) -> ReadFailure:
    """The `ReadFailure` of `err`, raised in this process (a worker, or the training process)."""
    cause = str(err) if isinstance(err, DataError) else f"{kind(err)}: {first_line(err)}"
    info = get_worker_info()
    return ReadFailure(
        cause=" ".join(cause.split()),  # one line, whatever the message held
        file=next(reversed(_watch.opened), ""),
        worker=info.id if info is not None else None,
        rank=rank,
        traceback="".join(traceback.format_exception(err)),
    )


def from_loader(err: BaseException, rank: int) -> ReadFailure:
    """A `ReadFailure` for an error the DataLoader itself raised in the training process.

    Such as a worker killed (out of memory) or a batch that cannot be sent back. Its message
    begins "Caught X in DataLoader worker process N" where a worker raised it: the last line
    is the cause.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    cause, worker = f"{kind(err)}: {lines[0] if lines else '(no message)'}", None
    if lines and lines[0].startswith("Caught ") and " worker process " in lines[0]:
        cause = lines[-1]
        worker = int(lines[0].rstrip(".").rsplit(" ", 1)[-1])
    text = "".join(traceback.format_exception(err))
    return ReadFailure(" ".join(cause.split()), "", worker, rank, text)
