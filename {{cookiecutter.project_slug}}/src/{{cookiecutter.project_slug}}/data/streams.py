"""Streams: data sets without length or random access, read with a position a checkpoint holds.

A task's split may be any `torch.utils.data.IterableDataset`. In every DataLoader worker (or
in the main process without workers) a `StreamFeed` wraps it. The feed tells the stream which
part it reads (`stream_part`), sets its epoch, puts it back where the checkpoint left it, forms
batches and tags each batch with where its worker stands after it: the samples it pulled from
the stream and, for a stream with `state_dict()` and `load_state_dict()` (torchdata's
protocol), the stream's own state. The main process keeps the tag of the last batch it *used*
from each worker, so a checkpoint holds what was trained on, never what was prefetched.

Resume, by what the stream offers:
- no state of its own: the worker pulls again, and throws away, as many samples as it had
  pulled (exact for a stream that yields the same samples in each epoch, or one that draws
  from generators the feed seeds); the cost is reading them again;
- a state: `load_state_dict` before `iter`, nothing re-read. `ShuffleBuffer` is such a
  stream: its state holds the buffer's samples, so even a shuffled order resumes exactly.

Randomness a stream draws while it yields (augmentation) is seeded per batch from (run seed,
epoch, part, batch), as the map-style path does, so it is the same on every start.

The split: a stream that calls `stream_part()` takes its own share of the processes and
workers (whole files each, say); any other stream is read by every process, which keeps every
world_size-th sample, and must split itself across DataLoader workers with
`torch.utils.data.get_worker_info()` as PyTorch documents (the feed stops a run whose workers
yield the same first batch).
"""

import hashlib
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..errors import DataError, first_line
from ..task import Batch, batch_seed, check_structure, seeded_batch
from . import failures
from .failures import ReadFailure


@dataclass(frozen=True)
class StreamPart:
    """Which part of a stream one copy reads: a process (rank) and one of its workers."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    @property
    def index(self) -> int:
        """This part's number among all parts, 0 .. count - 1."""
        return self.rank * self.workers + self.worker

    @property
    def count(self) -> int:
        """Parts in all: processes x workers per process."""
        return self.world * self.workers


@dataclass
class _Context:
    """What the feed tells the stream it iterates in this process (one at a time)."""

    part: StreamPart | None = None
    asked: bool = False  # the stream called stream_part(): it takes its own share


_context = _Context()


def current_part() -> StreamPart:
    """The part this copy reads, without taking the share (for seeds and file lists)."""
    if _context.part is not None:
        return _context.part
    info = get_worker_info()
    return StreamPart(worker=info.id, workers=info.num_workers) if info else StreamPart()


def stream_part() -> StreamPart:
    """The part this copy of a stream reads; calling it says the stream takes that share.

    In training the feed sets it (rank and world from the launcher, the DataLoader worker);
    elsewhere (prepare, a test) it is one part, or the worker's part inside a DataLoader.
    """
    _context.asked = True
    return current_part()


def stateful(stream: object) -> bool:
    """Whether `stream` keeps a position of its own (torchdata's protocol)."""
    return callable(getattr(stream, "state_dict", None)) and callable(
        getattr(stream, "load_state_dict", None)
    )


def inexact_state(stream: object) -> str:
    """Why `stream`'s own state would not resume it exactly; "" where it would, as far as known.

    Known: a Hugging Face `datasets` stream shuffled through its own buffer (`.shuffle(...)`).
    Its `state_dict()` holds no buffer contents, so a resume refills the buffer with other rows,
    and with DataLoader workers its `load_state_dict` fails (an IndexError, datasets 5).
    `hf_stream` shuffles by replaying the epoch instead. A `ShuffleBuffer` is as exact as the
    stream inside it.
    """
    if isinstance(stream, ShuffleBuffer):
        return inexact_state(stream.stream)
    if type(stream).__module__.startswith("datasets.") and _hf_buffered(stream):
        return (
            "a Hugging Face datasets stream shuffled through its own buffer: datasets saves no "
            "buffer contents, so its resume would read other rows or fail"
        )
    return ""


def _hf_buffered(stream: object) -> bool:
    """Whether a `datasets.IterableDataset`'s chain of example iterables holds a shuffle buffer."""
    chain = [getattr(stream, "_ex_iterable", None)]
    while chain:
        node = chain.pop()
        if node is None:
            continue
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        chain += [getattr(node, "ex_iterable", None), *getattr(node, "ex_iterables", [])]
    return False


@dataclass
class Tag:
    """Where one worker stands after a batch: what a checkpoint keeps of it.

    A plain class, not a tuple: the DataLoader's pin-memory thread leaves it alone.
    """

    worker: int  # the DataLoader worker (0 without workers)
    pulled: int  # samples pulled from the stream this epoch, kept or not
    batches: int  # batches this worker formed this epoch
    state: Any = None  # the stream's state_dict() after the batch, for a stateful stream
    first: str = ""  # digest of the worker's first batch in this pass (else empty)
    done: bool = False  # the worker's stream ran out: no batch comes with this tag
    failure: ReadFailure | None = None  # reading failed: no batch comes, nor any after it

    def saved(self) -> dict[str, Any]:
        """The tag as a checkpoint stores it."""
        return {"pulled": self.pulled, "batches": self.batches, "state": self.state}


@dataclass
class StreamFeed(IterableDataset):
    """The batches of one process's part of `stream`, each with its `Tag` (see the module).

    `resume` maps worker numbers to their saved tags. After its last batch a worker sends a
    tag with `done` (and no batch), so the main process knows whose turn ends.
    """

    stream: Iterable[Any]
    part: StreamPart  # rank, world and workers; the worker is filled in each worker
    epoch: int  # -1: evaluation (no epoch set, one fixed draw)
    batch_size: int
    seed: int
    collate: Callable[[list[Any]], Batch]
    where: str  # "task x: train stream", for messages
    train: bool = True  # drop each worker's incomplete last batch
    resume: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    check_items: bool = False  # no task collate: the first sample must be batchable by torch

    def __iter__(self) -> Iterator[tuple[Batch | None, Tag]]:
        """This worker's batches with their tags; a failure ends them with a tag that says it.

        Whatever raises while a batch is made (the stream, the task's collate) is caught here,
        in the worker, and sent as a `ReadFailure` (see `failures`): never a traceback.
        """
        info = get_worker_info()
        worker = info.id if info else 0
        batches = self._batches(worker)
        while True:
            try:
                with failures.reading():
                    pair = next(batches)
            except StopIteration:
                return
            except Exception as err:  # anything at all: the training process decides
                failure = failures.caught(err, self.part.rank)
                yield None, Tag(worker, 0, 0, done=True, failure=failure)
                return
            yield pair

    def _batches(self, worker: int) -> Iterator[tuple[Batch | None, Tag]]:
        """This worker's batches with their tags (see the module)."""
        info = get_worker_info()
        part = StreamPart(self.part.rank, self.part.world, worker, self.part.workers)
        _context.part, _context.asked = part, False
        saved = self.resume.get(worker)
        keeps_state = stateful(self.stream)
        if self.epoch >= 0 and callable(setter := getattr(self.stream, "set_epoch", None)):
            setter(self.epoch)
        if saved is not None and keeps_state:
            self.stream.load_state_dict(saved["state"])  # type: ignore[attr-defined]
        source = iter(self.stream)
        pulled = saved["pulled"] if saved is not None else 0
        made = saved["batches"] if saved is not None else 0
        if saved is not None and not keeps_state:
            for _ in islice(source, pulled):  # replay: the same samples, thrown away
                pass
        first = made == 0  # the checks and the duplicate digest: first batch of an epoch
        share: Iterator[Any] | None = None
        split, offset, kept, start = False, 0, 0, pulled
        while True:
            seed = batch_seed(self.seed, self.epoch, made * part.count + part.index)
            # A worker's generators serve the stream alone: seeded, not saved and restored.
            with seeded_batch(seed, restore=info is None):
                if share is None:  # the first pull runs the stream up to its first sample
                    head = list(islice(source, 1))
                    split = part.world > 1 and not _context.asked
                    offset = (part.rank - start) % part.world if split else 0
                    share = chain(head, source)
                    if split:  # every world-th sample is this process's
                        share = islice(share, offset, None, part.world)
                items = list(islice(share, self.batch_size))
            kept += len(items)
            pulled = start + (offset + (kept - 1) * part.world + 1 if split and kept else kept)
            if not items or (self.train and len(items) < self.batch_size):
                yield None, Tag(worker, pulled, made, done=True)
                return
            made += 1
            batch = self._batch(items) if first else self.collate(items)
            state = self.stream.state_dict() if keeps_state else None  # type: ignore[attr-defined]
            digest = content_digest(items) if first else ""
            yield batch, Tag(worker, pulled, made, state, digest)
            first = False

    def __reduce__(self) -> tuple[Callable[..., "StreamFeed"], tuple[bytes]]:
        """Sent to a worker by value (plain pickle), never through torch's shared memory.

        The workers of a fork server receive the feed pickled; torch's sharing of tensors
        between processes cannot send an empty one, which a resumed position may hold.
        """
        return _feed_from, (pickle.dumps(vars(self)),)

    def _batch(self, items: list[Any]) -> Batch:
        """The first batch, with the clear line `check_first_sample` gives map-style data."""
        if self.check_items:
            check_structure(items[0], f"{self.where} item 0")
        try:
            return self.collate(items)
        except DataError:
            raise
        except Exception as err:  # torch's message names the problem; one line is enough
            message = first_line(err)
            hint = "pad them in the task's collate()" if self.check_items else "see its collate()"
            raise DataError(
                f"{self.where}: its first samples cannot be batched ({message}); {hint}"
            ) from None


def _feed_from(fields: bytes) -> StreamFeed:
    """A `StreamFeed` again, from what its `__reduce__` sent."""
    feed = StreamFeed.__new__(StreamFeed)
    feed.__dict__.update(pickle.loads(fields))  # noqa: S301  (sent by this process's parent)
    return feed


def content_digest(value: Any) -> str:
    """A digest of what samples hold (tensor bytes, numbers, strings), not of their objects."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            digest.update(item.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
        elif isinstance(item, Mapping):
            for key in sorted(item, key=str):
                digest.update(str(key).encode())
                feed(item[key])
        elif isinstance(item, list | tuple):
            for part in item:
                feed(part)
        else:
            digest.update(repr(item).encode())

    feed(value)
    return digest.hexdigest()


class ShuffleBuffer(IterableDataset):
    """The samples of `stream` in a seeded random order, drawn from a buffer of `size`.

    Its state holds the buffer's samples, its generator and the inner stream's position (its
    own state, or the samples pulled from it), so a resume continues the very same order.
    The generator is seeded from (seed, epoch, part): each epoch and each worker differs, and
    every start of the same epoch draws the same. A state of N samples costs N samples' bytes
    in each checkpoint, per worker and process.
    """

    def __init__(self, stream: Iterable[Any], size: int, seed: int = 0) -> None:
        """Shuffle `stream` through a buffer of `size` samples."""
        if size < 1:
            raise DataError(f"ShuffleBuffer: size must be at least 1, got {size}")
        self.stream, self.size, self.seed, self.epoch = stream, size, seed, 0
        self._pending: Mapping[str, Any] | None = None
        self._started = False  # no position before the first sample is asked for
        self._buffer: list[Any] = []
        self._rng = torch.Generator()
        self._pulled = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (seeds the order; passed on to the inner stream)."""
        self.epoch = epoch
        if callable(setter := getattr(self.stream, "set_epoch", None)):
            setter(epoch)

    def source_files(self) -> list[Any]:
        """The inner stream's files, where it names them (for the data digest)."""
        return list(getattr(self.stream, "source_files", list)())

    def state_dict(self) -> dict[str, Any]:
        """The buffer's samples, the generator and the inner stream's position ({}: the start)."""
        if not self._started:
            return dict(self._pending or {})
        inner = self.stream.state_dict() if stateful(self.stream) else self._pulled  # type: ignore[attr-defined]
        return {"buffer": list(self._buffer), "rng": self._rng.get_state(), "inner": inner}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` at the next `iter`."""
        self._pending = state or None

    def __iter__(self) -> Iterator[Any]:
        """Samples in buffer order; the rest of the buffer, drawn at random, at the end."""
        pending, self._pending, self._started = self._pending, None, True
        part = current_part()
        self._rng.manual_seed(batch_seed(self.seed, self.epoch, part.index))
        self._buffer, self._pulled = [], 0
        if pending is not None:
            self._buffer, self._pulled = list(pending["buffer"]), 0
            self._rng.set_state(pending["rng"])
            if stateful(self.stream):
                self.stream.load_state_dict(pending["inner"])  # type: ignore[attr-defined]
        source = iter(self.stream)
        if pending is not None and not stateful(self.stream):
            self._pulled = int(pending["inner"])
            for _ in islice(source, self._pulled):
                pass
        buffer = self._buffer
        for item in source:
            self._pulled += 1
            if len(buffer) < self.size:
                buffer.append(item)
                continue
            j = int(torch.randint(self.size, (1,), generator=self._rng))
            out, buffer[j] = buffer[j], item
            yield out
        while buffer:
            j = int(torch.randint(len(buffer), (1,), generator=self._rng))
            buffer[j], buffer[-1] = buffer[-1], buffer[j]
            yield buffer.pop()


SAFE_TYPES = (torch.Tensor, int, float, bool, str, bytes, type(None))


def check_state(value: Any, where: str, path: str = "") -> None:
    """Raise a clear line when a stream's state holds what a checkpoint cannot load.

    Checkpoints are read with `torch.load(weights_only=True)`, which runs no code: tensors,
    numbers, strings, bytes and None in dicts, lists and tuples.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            check_state(key, where, path)
            check_state(item, where, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_state(item, where, f"{path}[{i}]")
    elif not isinstance(value, SAFE_TYPES):
        raise DataError(
            f"{where}: its state_dict() holds a {type(value).__module__}.{type(value).__name__} "
            f"at state{path}, which a checkpoint cannot load safely: use tensors, numbers, "
            "strings, lists and dicts"
        )
