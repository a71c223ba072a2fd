"""Feeding batches: sliced from tensors already on the device, or through a DataLoader.

Both paths draw exactly the same batches: each epoch a permutation seeded with seed + epoch
(the one DistributedSampler uses), cut so that every rank gets the same number of samples,
rank r taking every world_size-th element, and incomplete final batches dropped. So switching
paths, or resuming mid-epoch on either path, does not change the training trajectory.

The in-memory path skips per-sample `__getitem__` calls, collation and host-to-device copies,
which dominate the step time of small models; the DataLoader path is for data that does not
fit in memory (or needs per-sample work in worker processes).
"""

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from .distributed import DistEnv
from .preemption import ignore_stop_signals

Batch = tuple[torch.Tensor, torch.Tensor]


def rank_order(
    n: int, *, seed: int, epoch: int, rank: int, world: int, shuffle: bool = True
) -> torch.Tensor:
    """This rank's sample indices for one epoch (as DistributedSampler with drop_last=True)."""
    order = torch.arange(n)
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    per_rank = n // world
    return order[: per_rank * world][rank::world]


class InMemoryBatches:
    """Training batches indexed from device-resident tensors."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        denv: DistEnv,
        seed: int,
        device: torch.device,
    ) -> None:
        """Copy the split to `device` once."""
        self.x, self.y = x.to(device), y.to(device)
        self.batch_size, self.denv, self.seed, self.device = batch_size, denv, seed, device
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.y) // self.denv.world_size // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation is used."""
        self.epoch = epoch

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches of the current epoch, beginning with batch number `start`."""
        order = rank_order(
            len(self.y),
            seed=self.seed,
            epoch=self.epoch,
            rank=self.denv.rank,
            world=self.denv.world_size,
        )
        order = order[: len(self) * self.batch_size].to(self.device)
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.x[idx], self.y[idx]


class _SkipSampler(Sampler[int]):
    """Wraps a sampler and drops its first `skip` indices (mid-epoch resume)."""

    def __init__(self, inner: DistributedSampler) -> None:
        self.inner, self.skip = inner, 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return len(self.inner) - self.skip


class LoaderBatches:
    """Training batches from a DataLoader with a DistributedSampler."""

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
    ) -> None:
        """Build the loader once; workers persist across epochs."""
        self.sampler = DistributedSampler(
            dataset,
            num_replicas=denv.world_size,
            rank=denv.rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.skipper = _SkipSampler(self.sampler)
        self.batch_size, self.device = batch_size, device
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.skipper,
            drop_last=True,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",  # page-locked buffers allow async copies
            persistent_workers=num_workers > 0,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            worker_init_fn=ignore_stop_signals,
            # Its own generator: creating an iterator must not consume the global RNG, or a
            # resumed run would see different dropout masks than an uninterrupted one.
            generator=torch.Generator().manual_seed(seed),
        )

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.sampler) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation is used."""
        self.sampler.set_epoch(epoch)

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches of the current epoch, beginning with batch number `start`."""
        self.skipper.skip = start * self.batch_size
        for x, y in self.loader:
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


def eval_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, denv: DistEnv, device: torch.device
) -> Iterator[Batch]:
    """Every sample exactly once across ranks (rank r takes r, r + world, ...), in order."""
    idx = torch.arange(denv.rank, len(y), denv.world_size)
    for chunk in idx.split(batch_size):
        yield (x[chunk].to(device, non_blocking=True), y[chunk].to(device, non_blocking=True))


def make_train_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    in_memory: bool,
    batch_size: int,
    denv: DistEnv,
    seed: int,
    device: torch.device,
    num_workers: int,
    prefetch_factor: int,
) -> InMemoryBatches | LoaderBatches:
    """The fast in-memory path or the DataLoader path over the same tensors."""
    if in_memory:
        return InMemoryBatches(x, y, batch_size=batch_size, denv=denv, seed=seed, device=device)
    return LoaderBatches(
        TensorDataset(x, y),
        batch_size=batch_size,
        denv=denv,
        seed=seed,
        device=device,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
    )
