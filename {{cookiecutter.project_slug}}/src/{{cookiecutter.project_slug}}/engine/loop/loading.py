"""How a run loads its batches: one settings object for every feed it makes.

The training batches, the validation passes and a stream's passes (`batches`,
`stream_batches`) load with the same settings, taken from the run's configuration in one place
(`Loading.of`), and hand the same arguments to their DataLoaders (`dataloader_options`).
"""

from dataclasses import dataclass
from typing import Any

import torch

from ...config import Config
from ..parallel.distributed import DistEnv
from ..parallel.preemption import start_worker
from .transfer import Collate


@dataclass(frozen=True)
class Loading:
    """The settings every feed of a run loads with.

    `batch_size`: samples per batch on each process; `seed`: the run's (each epoch's order and
    each batch's random numbers come from it); `device`: where batches go; `workers`: DataLoader
    worker processes (0: the training process reads); `prefetch`: batches each worker keeps
    ready; `collate`: the task's own, or None for torch's.
    """

    batch_size: int
    denv: DistEnv
    seed: int
    device: torch.device
    workers: int
    prefetch: int
    collate: Collate | None

    @classmethod
    def of(
        cls,
        cfg: Config,
        denv: DistEnv,
        device: torch.device,
        workers: int,
        collate: Collate | None,
    ) -> "Loading":
        """The settings of a run configured by `cfg` (`workers` resolved: see `runtime`)."""
        return cls(
            batch_size=cfg.train.batch_size,
            denv=denv,
            seed=cfg.run.seed,
            device=device,
            workers=workers,
            prefetch=cfg.data.prefetch_factor,
            collate=collate,
        )

    def dataloader_options(self) -> dict[str, Any]:
        """The DataLoader arguments that every feed passes alike."""
        return {
            "num_workers": self.workers,
            "pin_memory": self.device.type == "cuda",  # page-locked buffers allow async copies
            "prefetch_factor": self.prefetch if self.workers > 0 else None,
            "worker_init_fn": start_worker,
            # Its own generator: starting a pass must not draw from the global one, or a
            # resumed run would see other dropout masks than an uninterrupted one.
            "generator": torch.Generator().manual_seed(self.seed),
        }
