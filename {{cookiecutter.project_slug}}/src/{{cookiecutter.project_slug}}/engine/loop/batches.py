"""Feeding batches: sliced from tensors already on the device, or through a DataLoader.

Both paths draw exactly the same samples: each epoch a permutation seeded with seed + epoch
(the one DistributedSampler uses), cut so that every rank gets the same number of samples,
rank r taking every world_size-th element, and incomplete final batches dropped. So switching
paths, or resuming mid-epoch on either path, does not change the training trajectory.

The in-memory path (for a `TensorDataset` that fits) skips per-sample `__getitem__` calls,
collation and host-to-device copies, which dominate the step time of small models. The
DataLoader path takes any map-style data set; its sampler hands out one key per batch (the
epoch and the batch's sample indices, cut from the permutation in one tensor call), and every
batch is loaded with torch, `random` and numpy seeded from (seed, epoch, its first index), so
random augmentation in workers is the same on every start and a resume is exact.
A task's own `collate` makes the batches of the DataLoader path (training and evaluation);
a data set's own `__getitems__` (one call for a whole batch) is used when it has one.

A batch whose reading fails (a damaged file in `__getitem__`, an error in `collate`) comes
back as a `ReadFailure` (see `data.failures`), caught where it happened: training stops on
every process after the last good optimizer step (`LoaderBatches`), evaluation raises it.
"""

from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    Sampler,
    TensorDataset,
    default_collate,
)

from ...data import failures
from ...data.failures import ReadError, ReadFailure
from ...data.streams import inexact_state
from ...errors import DataError, first_line
from ...task import Batch, batch_seed, check_structure, seeded_batch
from ..parallel import distributed
from ..parallel.distributed import DistEnv
from .loading import Loading
from .stream_batches import StreamBatches, is_stream
from .transfer import Collate, stop_workers, to_device


def rank_order(
    n: int, *, seed: int, epoch: int, rank: int, world: int, shuffle: bool = True
) -> torch.Tensor:
    """This rank's sample indices for one epoch (as DistributedSampler with drop_last=True)."""
    order = torch.arange(n)
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    per_rank = n // world
    return order[: per_rank * world][rank::world]


def size(dataset: Dataset) -> int:
    """Samples in a map-style data set (torch's `Dataset` type does not declare `__len__`)."""
    return len(dataset)


def tensor_bytes(dataset: Dataset) -> int | None:
    """Memory of a TensorDataset's tensors; None for data sets that load samples on demand."""
    if not isinstance(dataset, TensorDataset):
        return None
    return int(sum(t.element_size() * t.nelement() for t in dataset.tensors))


class InMemoryBatches:
    """Training batches indexed from device-resident tensors."""

    ended = False  # map-style data: the trainer counts an epoch's batches by its length
    edge_s = 0.0  # no waits at a pass's edges (a stream's: see stream_batches)

    def state(self) -> None:
        """No position of its own: the trainer's epoch and batch say where an epoch is."""

    def __init__(self, dataset: TensorDataset, loading: Loading) -> None:
        """Copy the data set's tensors to the device once."""
        self.tensors = [t.to(loading.device) for t in dataset.tensors]
        self.n = len(dataset)
        self.batch_size, self.denv, self.seed = loading.batch_size, loading.denv, loading.seed
        self.device = loading.device
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.denv.world_size // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation is used."""
        self.epoch = epoch

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches of the current epoch, beginning with batch number `start`."""
        order = rank_order(
            self.n,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.denv.rank,
            world=self.denv.world_size,
        )
        order = order[: len(self) * self.batch_size].to(self.device)
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield tuple(t[idx] for t in self.tensors)

    def close(self) -> None:
        """Nothing to release."""


class BatchKey(NamedTuple):
    """What a DataLoader worker needs to load one batch: its epoch (-1: evaluation) and indices."""

    epoch: int
    indices: list[int]


class SeededSamples(Dataset):
    """Loads the samples of a batch key with seeded RNGs.

    DataLoader workers call `__getitems__` with a whole batch's key. The seed depends on the
    epoch and the batch's first index: each index is in one batch of an epoch, and a resumed
    run draws the same batches, so each batch's random numbers are the same on every start.
    """

    def __init__(self, dataset: Dataset, seed: int, rank: int = 0) -> None:
        """Wrap `dataset`; `seed` is the run's seed, `rank` the process's (for failures)."""
        self.dataset, self.seed, self.rank = dataset, seed, rank
        # Indexing a TensorDataset draws no random numbers: no generators to seed then.
        self.draws = not isinstance(dataset, TensorDataset)

    def __len__(self) -> int:
        """Samples in the wrapped data set."""
        return size(self.dataset)

    def load(self, indices: list[int]) -> list[Any]:
        """The samples at `indices`: one `__getitems__` call where the data set has one."""
        many = getattr(self.dataset, "__getitems__", None)
        if many is not None:
            return list(many(indices))
        return [self.dataset[index] for index in indices]

    def __getitems__(self, key: BatchKey) -> list[Any]:
        """The samples of one batch, as they are drawn in its epoch; or its `ReadFailure`."""
        try:
            with failures.reading():
                if not self.draws:
                    return self.load(key.indices)
                with seeded_batch(batch_seed(self.seed, key.epoch, key.indices[0])):
                    return self.load(key.indices)
        except Exception as err:  # anything at all: sent as data, the trainer decides
            return [failures.caught(err, self.rank)]

    def __getitem__(self, key: BatchKey) -> Any:
        """The samples of one batch (DataLoader calls `__getitems__`; this is its fallback)."""
        return self.__getitems__(key)


class Collating:
    """The task's `collate` (or torch's) in the workers: a `ReadFailure` passes as the batch."""

    def __init__(self, collate: Collate | None, rank: int) -> None:
        """Batch with `collate`; `rank` names the process in a failure."""
        self.collate, self.rank = collate or default_collate, rank

    def __call__(self, items: list[Any]) -> Batch:
        """One batch of `items`, or the failure of reading or batching them."""
        if len(items) == 1 and isinstance(items[0], ReadFailure):
            return items[0]
        try:
            with failures.reading():
                return self.collate(items)
        except Exception as err:  # the task's collate: sent as data like a read's failure
            return failures.caught(err, self.rank)


_END = object()  # what `next` gives for a DataLoader's pass that has ended


def read_batches(live: Iterator[Any], rank: int) -> Iterator[Batch | ReadFailure]:
    """A DataLoader's batches; in place of one that failed its `ReadFailure`, and no more.

    The failure comes from a worker (`SeededSamples`, `Collating`) or from the loader itself
    (a worker killed, a batch it cannot send).
    """
    try:
        for batch in live:
            yield batch
            if isinstance(batch, ReadFailure):
                return
    except Exception as err:  # the loader's own
        yield failures.from_loader(err, rank)


class EpochBatches(Sampler[BatchKey]):
    """Batch keys of this rank's samples; `skip` drops the first batches (resume).

    One key per batch, cut from the epoch's order with one `tolist` call: per-sample keys
    grouped by a BatchSampler cost tens of microseconds per batch in Python, which a
    small model's step on a GPU would wait for.
    """

    def __init__(self, n: int, *, batch_size: int, seed: int, denv: DistEnv, train: bool) -> None:
        """`train`: shuffled, equal share per rank, full batches; else every sample once."""
        self.n, self.batch_size, self.seed, self.denv, self.train = n, batch_size, seed, denv, train
        self.epoch, self.skip = 0, 0

    def _order(self) -> torch.Tensor:
        if self.train:
            order = rank_order(
                self.n,
                seed=self.seed,
                epoch=self.epoch,
                rank=self.denv.rank,
                world=self.denv.world_size,
            )
            return order[: len(order) // self.batch_size * self.batch_size]  # drop the rest
        return torch.arange(self.denv.rank, self.n, self.denv.world_size)

    def __iter__(self) -> Iterator[BatchKey]:
        """The keys of the current epoch from batch `skip` on."""
        order, size_ = self._order(), self.batch_size
        if self.train:  # full batches only: one call for the rest of the epoch
            rows = order[self.skip * size_ :].view(-1, size_).tolist()
            return (BatchKey(self.epoch, row) for row in rows)
        # Evaluation: every sample, the last batch may be short; one fixed draw per batch.
        return (BatchKey(-1, chunk.tolist()) for chunk in order.split(size_)[self.skip :])

    def __len__(self) -> int:
        """Batches left in this epoch."""
        return -(-len(self._order()) // self.batch_size) - self.skip


def make_loader(dataset: Dataset, sampler: EpochBatches, loading: Loading) -> DataLoader:
    """A DataLoader over `dataset` in the order of `sampler` (one setting for all uses).

    Its workers persist from one pass to the next (training epochs, validation passes):
    starting them again would import torch and copy the data set into each one every time.
    """
    rank = loading.denv.rank
    return DataLoader(
        SeededSamples(dataset, loading.seed, rank),
        batch_sampler=sampler,
        collate_fn=Collating(loading.collate, rank),
        persistent_workers=loading.workers > 0,
        **loading.dataloader_options(),
    )


class LoaderBatches:
    """Batches from a DataLoader whose workers persist across passes (epochs, validations).

    `close` shuts the workers down; the trainer calls it on every way out of training.

    A training batch that failed to read stops every process before the optimizer step
    (`group` batches) that would need it, with `ReadError`. One process stops at once. Several
    learn of it from a vote that never waits (`distributed.StepVote`, one group late), so each
    reads one group further ahead than it uses: when a failure is found, every process still
    has good batches for the group in which the vote tells them all.
    """

    ended = False  # map-style data: the trainer counts an epoch's batches by its length
    edge_s = 0.0  # persistent workers: no waits at a pass's edges (a stream's: stream_batches)

    def state(self) -> None:
        """No position of its own: the trainer's epoch and batch say where an epoch is."""

    def __init__(
        self, dataset: Dataset, loading: Loading, *, train: bool = True, group: int = 1
    ) -> None:
        """Build the loader once; its workers start with the first pass.

        `group`: batches per optimizer step, the unit in which training stops after a failure.
        """
        self.sampler = EpochBatches(
            size(dataset),
            batch_size=loading.batch_size,
            seed=loading.seed,
            denv=loading.denv,
            train=train,
        )
        self.device, self.denv, self.group = loading.device, loading.denv, group
        self.vote = distributed.StepVote()
        self.loader: DataLoader | None = make_loader(dataset, self.sampler, loading)
        self.live: Iterator[Batch] | None = None  # the loader's iterator, owner of the workers

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.sampler.n // self.sampler.denv.world_size // self.sampler.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation is used."""
        self.sampler.epoch = epoch

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches of the current epoch, beginning with batch number `start`."""
        assert self.loader is not None, "iterate() after close()"
        self.sampler.skip = start
        self.live = iter(self.loader)  # persistent: the same iterator (and workers) each pass
        batches = read_batches(self.live, self.denv.rank)
        for batch in self._agreed(batches) if self.sampler.train else batches:
            if isinstance(batch, ReadFailure):  # evaluation's: split_sums tells the others
                raise ReadError(batch)
            yield to_device(batch, self.device)

    def _agreed(self, batches: Iterator[Batch | ReadFailure]) -> Iterator[Batch]:
        """Whole groups of `batches` while every process can read its own (see the class)."""
        several = self.denv.distributed
        reach = self.group * (2 if several else 1)  # batches read ahead of the group in use
        ahead: deque[Batch] = deque()
        failure: ReadFailure | None = None
        self.vote.settle()  # a vote of an abandoned pass
        first, more = True, True
        while ahead or more:
            while more and failure is None and len(ahead) < reach:
                batch = next(batches, _END)
                if isinstance(batch, ReadFailure):
                    failure = batch
                elif batch is _END:
                    more = False
                else:
                    ahead.append(batch)
            short = failure is not None and len(ahead) < self.group  # this group failed
            stop = short
            if several:  # the first group is agreed at once; later ones a group late
                stop = bool(distributed.most(int(short))) if first else False
                stop = self.vote.poll([failure is not None])[0] or stop
            if stop:
                self.vote.settle()
                raise ReadError(failure)
            for _ in range(min(self.group, len(ahead))):
                yield ahead.popleft()
            first = False

    def close(self) -> None:
        """Shut the worker processes down now, also after an error (see `stop_workers`)."""
        self.vote.settle()
        stop_workers(self.live)
        self.live = self.loader = None


class EvalBatches:
    """Evaluation batches: every sample exactly once across ranks (rank r takes r, r + world, ...).

    A TensorDataset without a task collate is sliced (no per-sample calls); anything else goes
    through a `LoaderBatches` whose workers serve every pass until `close`.
    """

    def __init__(self, dataset: Dataset, loading: Loading, *, where: str = "evaluation") -> None:
        """Prepare the passes; no worker starts before the first one (`where`: for messages)."""
        self.dataset, self.batch_size = dataset, loading.batch_size
        self.denv, self.device = loading.denv, loading.device
        self.loader: LoaderBatches | None = None
        self.stream: StreamBatches | None = None
        if is_stream(dataset):  # each pass with workers of its own (see stream_batches)
            self.stream = StreamBatches(dataset, loading, where=f"{where} stream")
        elif not (isinstance(dataset, TensorDataset) and loading.collate is None):
            self.loader = LoaderBatches(dataset, loading, train=False)

    def __iter__(self) -> Iterator[Batch]:
        """One pass over the split, in order."""
        if self.stream is not None:
            return self.stream.passes()
        if self.loader is not None:
            return self.loader.iterate()
        return self._slices()

    def _slices(self) -> Iterator[Batch]:
        assert isinstance(self.dataset, TensorDataset)
        idx = torch.arange(self.denv.rank, size(self.dataset), self.denv.world_size)
        for part in idx.split(self.batch_size):
            yield to_device(tuple(t[part] for t in self.dataset.tensors), self.device)

    def close(self) -> None:
        """Shut the workers down (see `LoaderBatches.close`)."""
        if self.stream is not None:
            self.stream.close()
        if self.loader is not None:
            self.loader.close()


def make_train_batches(
    dataset: Dataset,
    loading: Loading,
    *,
    in_memory: bool,
    group: int = 1,
    where: str = "train",
) -> "InMemoryBatches | LoaderBatches | StreamBatches":
    """The fast in-memory path (TensorDataset only), the DataLoader path, or a stream's.

    `group`: batches per optimizer step, the unit in which training stops after a failure;
    `where`: for messages.
    """
    if is_stream(dataset):
        if why := inexact_state(dataset):  # refused before training, never at its resume
            raise DataError(
                f"{where}: {why}; build it with hf_stream(files, shuffle_buffer=N, seed=...), "
                "which resumes a shuffled stream exactly by replaying the epoch, or hand it "
                "over unshuffled (docs/bring-your-own-task.md, 'Streams')"
            )
        return StreamBatches(dataset, loading, where=f"{where} stream", group=group)
    if in_memory:
        assert isinstance(dataset, TensorDataset)
        return InMemoryBatches(dataset, loading)
    return LoaderBatches(dataset, loading, group=group)


def check_first_sample(dataset: Dataset, where: str, collate: Collate | None = None) -> None:
    """One clear line when a data set is empty or its first samples cannot be batched.

    A stream is not read here (that would move its position): `StreamFeed` checks its first batch.

    Torch's collate needs tensors or numbers in every sample; a task's own `collate` may take
    and return anything (what is not a tensor stays on the host).
    """
    if is_stream(dataset):  # its first batch is checked in the worker that makes it
        return
    if size(dataset) == 0:
        raise DataError(f"{where} has no samples")
    first = [dataset[i] for i in range(min(2, size(dataset)))]
    if collate is None:
        check_structure(first[0], f"{where} item 0")
    try:
        (collate or default_collate)(first)
    except Exception as err:  # torch's message names the problem; one line is enough here
        message = first_line(err)
        hint = "pad them in the task's collate()" if collate is None else "see its collate()"
        raise DataError(
            f"{where}: items 0-{len(first) - 1} cannot be batched ({message}); {hint}"
        ) from None
