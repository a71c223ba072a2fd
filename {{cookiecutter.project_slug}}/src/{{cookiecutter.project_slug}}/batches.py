"""Feeding batches: sliced from tensors already on the device, or through a DataLoader.

Both paths draw exactly the same samples: each epoch a permutation seeded with seed + epoch
(the one DistributedSampler uses), cut so that every rank gets the same number of samples,
rank r taking every world_size-th element, and incomplete final batches dropped. So switching
paths, or resuming mid-epoch on either path, does not change the training trajectory.

The in-memory path (for a `TensorDataset` that fits) skips per-sample `__getitem__` calls,
collation and host-to-device copies, which dominate the step time of small models. The
DataLoader path takes any map-style data set; its sampler hands out (epoch, index) pairs, and
every batch is loaded with torch, `random` and numpy seeded from (seed, epoch, its first
index), so random augmentation in workers is the same on every start and a resume is exact.
A task's own `collate` makes the batches of the DataLoader path (training and evaluation);
a data set's own `__getitems__` (one call for a whole batch) is used when it has one.
"""

from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    TensorDataset,
    default_collate,
)

from .distributed import DistEnv
from .errors import DataError
from .preemption import ignore_stop_signals
from .task import Batch, batch_seed, check_structure, seeded_batch

Collate = Callable[[list[Any]], Batch]
"""A task's own `collate`; None stands for torch's `default_collate`."""


def rank_order(
    n: int, *, seed: int, epoch: int, rank: int, world: int, shuffle: bool = True
) -> torch.Tensor:
    """This rank's sample indices for one epoch (as DistributedSampler with drop_last=True)."""
    order = torch.arange(n)
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    per_rank = n // world
    return order[: per_rank * world][rank::world]


def to_device(batch: Batch, device: torch.device, channels_last: bool = False) -> Batch:
    """Move every tensor of a (nested) batch; images (4-D floats) optionally channels-last."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=True)
        if channels_last and batch.dim() == 4 and batch.is_floating_point():
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, channels_last) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(v, device, channels_last) for v in batch)
    return batch


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

    def __init__(
        self,
        dataset: TensorDataset,
        *,
        batch_size: int,
        denv: DistEnv,
        seed: int,
        device: torch.device,
    ) -> None:
        """Copy the data set's tensors to `device` once."""
        self.tensors = [t.to(device) for t in dataset.tensors]
        self.n = len(dataset)
        self.batch_size, self.denv, self.seed, self.device = batch_size, denv, seed, device
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


class SeededSamples(Dataset):
    """Loads the samples of a batch of (epoch, index) keys with seeded RNGs.

    DataLoader workers call `__getitems__` with a whole batch's keys. The seed depends on the
    epoch and the batch's first index: each index is in one batch of an epoch, and a resumed
    run draws the same batches, so each batch's random numbers are the same on every start.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        """Wrap `dataset`; `seed` is the run's seed."""
        self.dataset, self.seed = dataset, seed
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

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        """The samples of one batch, as they are drawn in its epoch."""
        indices = [index for _, index in keys]
        if not self.draws:
            return self.load(indices)
        epoch, first = keys[0]
        with seeded_batch(batch_seed(self.seed, epoch, first)):
            return self.load(indices)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        """One sample, drawn as the first of a batch."""
        return self.__getitems__([key])[0]


class EpochSampler(Sampler[tuple[int, int]]):
    """(epoch, index) keys of this rank's samples; `skip` drops the first ones (resume)."""

    def __init__(self, n: int, *, seed: int, denv: DistEnv, train: bool) -> None:
        """`train`: shuffled, equal share per rank; else every sample once, in order."""
        self.n, self.seed, self.denv, self.train = n, seed, denv, train
        self.epoch, self.skip = 0, 0

    def _order(self) -> torch.Tensor:
        if self.train:
            return rank_order(
                self.n,
                seed=self.seed,
                epoch=self.epoch,
                rank=self.denv.rank,
                world=self.denv.world_size,
            )
        return torch.arange(self.denv.rank, self.n, self.denv.world_size)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The keys of the current epoch from position `skip` on."""
        epoch = self.epoch if self.train else -1  # evaluation: one fixed draw per batch
        return ((epoch, i) for i in self._order()[self.skip :].tolist())

    def __len__(self) -> int:
        """Keys left in this epoch."""
        return len(self._order()) - self.skip


def stop_workers(iterator: object) -> None:
    """End a DataLoader iterator's worker processes now, whoever still holds the iterator.

    Workers ignore SIGTERM (see `ignore_stop_signals`), so multiprocessing's exit handler,
    which terminates and joins them, would wait forever for workers whose iterator a traceback
    keeps alive. The iterator's own shutdown (what its `__del__` runs: a done event, then a
    join) is called here explicitly; a worker still busy after that (stuck in task code) is
    killed. Without workers, or on a torch without this method, there is nothing to do.
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    shutdown()
    for worker in getattr(iterator, "_workers", []):
        if worker.is_alive():
            worker.kill()
            worker.join()


def make_loader(
    dataset: Dataset,
    sampler: EpochSampler,
    *,
    batch_size: int,
    seed: int,
    device: torch.device,
    num_workers: int,
    prefetch_factor: int,
    persistent: bool,
    collate: Collate | None,
) -> DataLoader:
    """A DataLoader over `dataset` in the order of `sampler` (one setting for all uses)."""
    return DataLoader(
        SeededSamples(dataset, seed),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate or default_collate,
        drop_last=sampler.train,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",  # page-locked buffers allow async copies
        persistent_workers=persistent and num_workers > 0,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        worker_init_fn=ignore_stop_signals,
        # Its own generator: creating an iterator must not consume the global RNG, or a
        # resumed run would see different dropout masks than an uninterrupted one.
        generator=torch.Generator().manual_seed(seed),
    )


class LoaderBatches:
    """Training batches from a DataLoader whose workers persist across epochs.

    `close` shuts the workers down; the trainer calls it on every way out of training.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        denv: DistEnv,
        seed: int,
        device: torch.device,
        num_workers: int,
        prefetch_factor: int,
        collate: Collate | None,
    ) -> None:
        """Build the loader once."""
        self.sampler = EpochSampler(size(dataset), seed=seed, denv=denv, train=True)
        self.batch_size, self.device = batch_size, device
        self.loader: DataLoader | None = make_loader(
            dataset,
            self.sampler,
            batch_size=batch_size,
            seed=seed,
            device=device,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            persistent=True,
            collate=collate,
        )
        self.live: Iterator[Batch] | None = None  # the loader's iterator, owner of the workers

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.sampler.n // self.sampler.denv.world_size // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation is used."""
        self.sampler.epoch = epoch

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches of the current epoch, beginning with batch number `start`."""
        assert self.loader is not None, "iterate() after close()"
        self.sampler.skip = start * self.batch_size
        self.live = iter(self.loader)  # persistent: the same iterator (and workers) each epoch
        for batch in self.live:
            yield to_device(batch, self.device)

    def close(self) -> None:
        """Shut the worker processes down now, also after an error (see `stop_workers`)."""
        stop_workers(self.live)
        self.live = self.loader = None


def eval_batches(
    dataset: Dataset,
    *,
    batch_size: int,
    denv: DistEnv,
    seed: int,
    device: torch.device,
    num_workers: int,
    prefetch_factor: int,
    collate: Collate | None,
) -> Generator[Batch]:
    """Every sample exactly once across ranks (rank r takes r, r + world, ...), in order."""
    if isinstance(dataset, TensorDataset) and collate is None:  # slices, no per-sample calls
        idx = torch.arange(denv.rank, size(dataset), denv.world_size)
        for chunk in idx.split(batch_size):
            yield to_device(tuple(t[chunk] for t in dataset.tensors), device)
        return
    sampler = EpochSampler(size(dataset), seed=seed, denv=denv, train=False)
    loader = make_loader(
        dataset,
        sampler,
        batch_size=batch_size,
        seed=seed,
        device=device,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        persistent=False,
        collate=collate,
    )
    # Close this generator (`contextlib.closing`) when its consumer fails: the finally
    # block ends the workers at once, not when the traceback is dropped (see `stop_workers`).
    iterator = iter(loader)
    try:
        for batch in iterator:
            yield to_device(batch, device)
    finally:
        stop_workers(iterator)


def make_train_batches(
    dataset: Dataset,
    *,
    in_memory: bool,
    batch_size: int,
    denv: DistEnv,
    seed: int,
    device: torch.device,
    num_workers: int,
    prefetch_factor: int,
    collate: Collate | None = None,
) -> InMemoryBatches | LoaderBatches:
    """The fast in-memory path (TensorDataset only) or the DataLoader path."""
    if in_memory:
        assert isinstance(dataset, TensorDataset)
        return InMemoryBatches(dataset, batch_size=batch_size, denv=denv, seed=seed, device=device)
    return LoaderBatches(
        dataset,
        batch_size=batch_size,
        denv=denv,
        seed=seed,
        device=device,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        collate=collate,
    )


def check_first_sample(dataset: Dataset, where: str, collate: Collate | None = None) -> None:
    """One clear line when a data set is empty or its first samples cannot be batched.

    Torch's collate needs tensors or numbers in every sample; a task's own `collate` may take
    and return anything (what is not a tensor stays on the host).
    """
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise DataError(
            f"{where} is a stream ({type(dataset).__name__}), not a map-style data set with "
            "__len__ and __getitem__: write the stream into shards in prepare() (see 'Streams' "
            "in docs/bring-your-own-task.md)"
        )
    if size(dataset) == 0:
        raise DataError(f"{where} has no samples")
    first = [dataset[i] for i in range(min(2, size(dataset)))]
    if collate is None:
        check_structure(first[0], f"{where} item 0")
    try:
        (collate or default_collate)(first)
    except Exception as err:  # torch's message names the problem; one line is enough here
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        hint = "pad them in the task's collate()" if collate is None else "see its collate()"
        raise DataError(
            f"{where}: items 0-{len(first) - 1} cannot be batched ({message}); {hint}"
        ) from None
