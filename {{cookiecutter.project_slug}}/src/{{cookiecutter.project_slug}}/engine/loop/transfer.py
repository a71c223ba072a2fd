"""Moving batches to the device, and ending a DataLoader's workers: shared by every feed."""

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...task import Batch

Collate = Callable[[list[Any]], Batch]
"""A task's own `collate`; None stands for torch's `default_collate`."""


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


def stop_workers(iterator: object) -> None:
    """End a DataLoader iterator's worker processes now, whoever still holds the iterator.

    Workers ignore SIGTERM (see `preemption.start_worker`), so multiprocessing's exit handler,
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
