"""Batches of a stream (an `IterableDataset`): the main process's side of `data.streams`.

Each pass starts a DataLoader over a `StreamFeed` (its workers know the epoch and where each
must resume, so they live for one pass). The batches are used in turns of the workers, one
batch each, in a fixed order that a resumed pass continues from the worker whose turn was
next (the DataLoader itself always begins with worker 0), and the tag of each batch used is
kept: `state()` is this process's position for a checkpoint,
`restore` puts it back. Without a length, an epoch ends when a stream runs out: the
processes vote before each optimizer step's group of batches (one small all-reduce on the
host) and all stop on the same group when any one has no full group left, so no process
waits in a collective the others never join. What is left in the longer streams of that
epoch is skipped, as `drop_last` does for map-style data. The same vote stops every process
when reading failed on one (a damaged file: a `ReadFailure` from the worker, see
`data.failures`): the group before the failure is still used, then `ReadError` is raised on
every process, so the trainer checkpoints the last good step with every process's position.

A pass's workers are forked by a fork server (`multiprocessing`'s "forkserver"), not by the
training process: CPython up to 3.11.9 (gh-112275, fixed in 3.11.10 and 3.12) can hang a
child forked while another thread of the parent holds the interpreter's lock on its list of
threads, and a training process runs other threads (communication, background saves, the
last pass's queues) when a pass starts. Seen here as a pass that never began on one process
of two, about one run in ten under load. The server is one clean process that imported torch
once; the stream and the task's collate go to each worker pickled, so they must be picklable
(defined at module level, as in a task module).
"""

import multiprocessing
import multiprocessing.forkserver
import pickle
import time
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from ...data import failures
from ...data.failures import ReadError
from ...data.streams import StreamFeed, StreamPart, Tag, check_state
from ...errors import DataError, first_line
from ...task import Batch
from ..parallel import distributed
from .loading import Loading
from .transfer import stop_workers, to_device

# A process's verdict on its next group of batches; the processes go by the largest.
FULL, SHORT, FAILED = 0, 1, 2  # full; short (its stream ran out: the epoch ends); reading failed


def is_stream(dataset: object) -> bool:
    """Whether a split is a stream (an IterableDataset, or anything without `__len__`)."""
    return isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")


def _as_is(item: Any) -> Any:
    """The feed's batches pass the loader untouched (they are collated in the worker)."""
    return item


def in_turns(
    pairs: Iterator[tuple[Batch | None, Tag]], workers: int, first: int
) -> Iterator[tuple[Batch, Tag]]:
    """The workers' batches one each in turn, from worker `first` on, until every one is done.

    Batches that arrive before their worker's turn wait (at most one round of them). A worker
    whose reading failed raises `ReadError` in its turn: the batches before it are good.
    """
    waiting: dict[int, deque[tuple[Batch | None, Tag]]] = {w: deque() for w in range(workers)}
    active, turn = list(range(workers)), first
    while active:
        while not waiting[turn]:
            batch, tag = next(pairs)
            waiting[tag.worker].append((batch, tag))
        batch, tag = waiting[turn].popleft()
        if tag.failure is not None:
            raise ReadError(tag.failure)
        index = active.index(turn)
        if tag.done:
            active.remove(turn)
        else:
            index += 1
            yield batch, tag
        turn = active[index % len(active)] if active else turn


def fork_server(stream: object) -> multiprocessing.context.BaseContext:
    """The context whose server forks the workers, started now with what `stream` needs.

    The server starts once per process and keeps what it imported then: torch, this package,
    the module of the stream's class (the task's, with its imports) and the modules the stream
    names in `worker_modules` (those its workers import on first use: `datasets` for
    `hf_stream`, a second of each worker's start in every pass otherwise). It starts while the
    trainer builds the model and reads the checkpoint, not when the first pass waits for it.
    """
    context = multiprocessing.get_context("forkserver")
    first = f"{__package__}.fork_server_start"  # stop signals are the training process's
    stream_modules = [type(stream).__module__, *getattr(stream, "worker_modules", ())]
    context.set_forkserver_preload([first, "torch", StreamFeed.__module__, *stream_modules])
    multiprocessing.forkserver.ensure_running()
    return context


def check_picklable(sent: object, where: str) -> None:
    """Refuse, in one line, a stream or collate that cannot go to a fork server's workers."""
    try:
        pickle.dumps(sent)
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        message = first_line(err)
        raise DataError(
            f"{where}: cannot be sent to its DataLoader workers ({message}): define the "
            "stream's class and the task's collate at module level, with no lambda or open "
            "generator in them (docs/bring-your-own-task.md, 'Streams'), or set "
            "data.num_workers=0"
        ) from None


class StreamBatches:
    """This process's batches of a stream, by epoch, with a position a checkpoint holds.

    `group`: batches per optimizer step (gradient accumulation); an epoch ends after the
    last group that is full on every process, and `ended` says so while its last batch is used.
    """

    def __init__(self, stream: Dataset, loading: Loading, *, where: str, group: int = 1) -> None:
        """Nothing starts before the first pass."""
        self.stream, self.loading, self.where, self.group = stream, loading, where, group
        self.batch_size, self.denv, self.seed = loading.batch_size, loading.denv, loading.seed
        self.device, self.workers, self.collate = loading.device, loading.workers, loading.collate
        self.epoch, self.ended = 0, False
        self.failure: failures.ReadFailure | None = None  # this process's, in the last pass
        # Seconds waited for a pass's first group (its workers start) and for its short last
        # one (they finish: e.g. datasets' pause at a shuffled pass's end), for the summary.
        self.edge_s = 0.0
        self.tags: dict[int, Tag] = {}  # per worker: the tag of its last batch used
        self.next_worker = 0  # whose batch comes next
        self.resume: dict[int, Mapping[str, Any]] = {}  # the saved tags, for the next pass
        self.live: Iterator[Any] | None = None
        self.context = None
        if self.workers > 0:
            check_picklable((stream, self.collate), where)
            self.context = fork_server(stream)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; a new epoch starts every worker from its beginning."""
        if epoch != self.epoch:
            self.tags, self.next_worker, self.resume = {}, 0, {}
        self.epoch = epoch

    def state(self) -> dict[str, Any]:
        """This process's position in the epoch: each worker's last tag and who is next."""
        tags = {worker: tag.saved() for worker, tag in self.tags.items()}
        check_state([tag["state"] for tag in tags.values()], f"{self.where}")
        return {
            "epoch": self.epoch,
            "workers": max(1, self.workers),
            "world": self.denv.world_size,
            "batch_size": self.batch_size,
            "next": self.next_worker,
            "tags": tags,
        }

    def restore(self, saved: list[Any], run: str) -> None:
        """Take this process's position from the checkpoint's per-process list `saved`.

        The position belongs to one split of the stream: another process count, worker count
        or batch size would read other samples, so the resume is refused in one line, the
        same on every process (checked before this process looks for its own position).
        """
        positions = [position for position in saved if isinstance(position, Mapping)]
        if not positions:
            raise DataError(
                f"{self.where}: run {run}'s checkpoint holds no stream position (it was "
                "trained on other data): start a new run.name"
            )
        now = (max(1, self.workers), self.denv.world_size, self.batch_size)
        then = (positions[0]["workers"], len(saved), positions[0]["batch_size"])
        mine = saved[self.denv.rank] if self.denv.rank < len(saved) else None
        if now != then or not isinstance(mine, Mapping):
            raise DataError(
                f"{self.where}: run {run} stopped at a stream position of {then[0]} worker(s) x "
                f"{then[1]} process(es), batch {then[2]}; now {now[0]} x {now[1]}, batch "
                f"{now[2]}: resume with data.num_workers={then[0]}, {then[1]} process(es) and "
                f"train.batch_size={then[2]}, or start a new run.name"
            )
        self.set_epoch(mine["epoch"])
        self.resume, self.next_worker = dict(mine["tags"]), mine["next"]
        self.tags = {
            w: Tag(w, t["pulled"], t["batches"], t["state"]) for w, t in mine["tags"].items()
        }

    def _loader(self, feed: StreamFeed) -> DataLoader:
        return DataLoader(
            feed,
            multiprocessing_context=self.context,
            batch_size=None,  # the feed makes the batches
            collate_fn=_as_is,
            **self.loading.dataloader_options(),
        )

    def _tagged(self, train: bool, epoch: int) -> Iterator[tuple[Batch, Tag]]:
        """One pass's (batch, tag) pairs; a new pass ends the workers of the last one."""
        workers = max(1, self.workers)
        feed = StreamFeed(
            self.stream,
            StreamPart(self.denv.rank, self.denv.world_size, 0, workers),
            epoch,
            self.batch_size,
            self.seed,
            self.collate or default_collate,
            self.where,
            train=train,
            resume=self.resume if train else {},
            check_items=self.collate is None,
        )
        stop_workers(self.live)
        self.live = iter(self._loader(feed))
        firsts: dict[str, int] = {}
        try:
            for batch, tag in in_turns(self.live, workers, self.next_worker if train else 0):
                other = firsts.setdefault(tag.first, tag.worker) if tag.first else tag.worker
                if other != tag.worker and workers > 1:
                    raise DataError(
                        f"{self.where}: workers {other} and {tag.worker} yielded the same first "
                        "batch: split the stream across workers with get_worker_info() or "
                        "stream_part() (docs/bring-your-own-task.md, 'Streams')"
                    )
                yield batch, tag
        except DataError:  # a ReadError from a worker's tag, or the check above
            raise
        except Exception as err:  # the loader's own: a worker killed, a batch it cannot send
            raise ReadError(failures.from_loader(err, self.denv.rank)) from err

    def _pull(self, source: Iterator[tuple[Batch, Tag]]) -> tuple[list[tuple[Batch, Tag]], int]:
        """The next group of batches and this process's verdict on it (FULL, SHORT, FAILED)."""
        try:
            group = list(islice(source, self.group))
        except ReadError as failed:
            self.failure = failed.failure
            return [], FAILED
        return group, FULL if len(group) == self.group else SHORT

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """The epoch's batches from where `restore` (or the last pass) left off.

        `start` (batches used this epoch) is the trainer's count; a stream's position is its
        tags, so it is only checked against them.
        """
        if start and not self.resume:
            raise DataError(f"{self.where}: asked to start at batch {start} without a position")
        self.ended, self.failure = False, None
        source = self._tagged(train=True, epoch=self.epoch)
        waiting = time.perf_counter()
        group, mine = self._pull(source)
        verdict = distributed.most(mine)
        self.edge_s += time.perf_counter() - waiting
        if verdict == SHORT and self.epoch == 0 and not self.resume:
            raise DataError(
                f"{self.where}: fewer than train.batch_size x train.grad_accum_steps = "
                f"{self.batch_size * self.group} samples in the first epoch of "
                f"process {self.denv.rank} (or another): lower them, or check the stream"
            )
        self.resume = {}
        while verdict == FULL:
            waiting = time.perf_counter()
            following, mine = self._pull(source)
            verdict = distributed.most(mine)
            if verdict != FULL:  # the pass's end
                self.edge_s += time.perf_counter() - waiting
            for i, (batch, tag) in enumerate(group):
                self.tags[tag.worker] = tag
                self.next_worker = (tag.worker + 1) % max(1, self.workers)
                self.ended = verdict == SHORT and i == len(group) - 1
                yield to_device(batch, self.device)
            group = following
        if verdict == FAILED:  # on every process, after the last good group
            raise ReadError(self.failure)

    def passes(self) -> Iterator[Batch]:
        """One evaluation pass: every sample of this process's part once, the last batch short."""
        for batch, _ in self._tagged(train=False, epoch=-1):
            yield to_device(batch, self.device)

    def close(self) -> None:
        """Shut the current pass's workers down now (see `batches.stop_workers`)."""
        stop_workers(self.live)
        self.live = None
