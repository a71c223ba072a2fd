"""The training scalars since the last train row: the loss, and what the task records.

Each micro-batch adds its loss, and any scalar the task recorded in `loss` (`Task.record`:
a per-head loss, an accuracy on the batch), to a sum on the device: nothing waits for the
GPU until a train row is due. Then one all-reduce adds every process's sums and counts, so
a row holds each scalar's mean over the micro-batches of the interval and over the
processes. The sums are saved in the checkpoint of each process, so a row that a stop cut in
two is the same after the resume as in a run that never stopped.
"""

from typing import Any

import torch

from ..parallel import distributed
from ..parallel.distributed import DistEnv


class TrainScalars:
    """Sums and counts of the training scalars since the last train row (one process)."""

    def __init__(self, device: torch.device, names: tuple[str, ...]) -> None:
        """Empty sums for the loss and the task's `train_scalars` `names`, on `device`."""
        self.device, self.names = device, ("loss", *names)
        self.sums = {name: torch.zeros((), device=device) for name in self.names}
        self.counts = dict.fromkeys(self.names, 0)

    def add(self, loss: torch.Tensor, recorded: list[tuple[str, torch.Tensor | float]]) -> None:
        """A micro-batch's loss (detached) and the scalars the task recorded with it."""
        self.sums["loss"] += loss
        self.counts["loss"] += 1
        for name, value in recorded:
            self.sums[name] += value.detach().float() if isinstance(value, torch.Tensor) else value
            self.counts[name] += 1

    def means(self, denv: DistEnv) -> dict[str, float]:
        """Each scalar's mean over the interval and every process (all ranks call this).

        A scalar no process recorded in the interval is left out (an empty cell).
        """
        counts = torch.tensor([self.counts[n] for n in self.names])  # sum_tensors places it
        total = distributed.sum_tensors({**self.sums, "_counts": counts}, denv, self.device)
        counted = total["_counts"].tolist()
        return {
            name: float(total[name].item()) / count
            for name, count in zip(self.names, counted, strict=True)
            if count
        }

    def reset(self) -> None:
        """Start the next interval."""
        for name in self.names:
            self.sums[name].zero_()
            self.counts[name] = 0

    def state(self) -> dict[str, tuple[torch.Tensor, int]]:
        """This process's sums and counts, on the CPU, for the checkpoint."""
        return {name: (self.sums[name].cpu(), self.counts[name]) for name in self.names}

    def load(self, state: dict[str, Any]) -> None:
        """Sums and counts from a checkpoint's `state` (names the task no longer has: dropped)."""
        for name, (total, count) in state.items():
            if name in self.sums:
                self.sums[name] = total.to(self.device)
                self.counts[name] = count
