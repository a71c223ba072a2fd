"""What the data and the settings make of a run: the batch path, batches and steps per epoch."""

from typing import Any

import torch

from ...config import Config
from ...errors import ConfigError
from ...task import Datasets, Task, own_collate
from ..parallel import distributed
from ..parallel.runtime import fits_in_memory, packed_runs
from .batches import check_first_sample, size, tensor_bytes
from .stream_batches import is_stream


def in_memory(cfg: Config, task_name: str, train_set: Any, device: torch.device) -> bool:
    """Whether batches are sliced from tensors on the device (`data.in_memory`)."""
    nbytes = tensor_bytes(train_set)
    if cfg.data.in_memory == "yes" and nbytes is None:
        raise ConfigError(
            f"data.in_memory = 'yes' needs a TensorDataset; task {task_name}'s train set "
            f"is a {type(train_set).__name__}: use 'auto' or 'no'"
        )
    return nbytes is not None and (
        cfg.data.in_memory == "yes"
        or (
            cfg.data.in_memory == "auto"
            and fits_in_memory(nbytes, cfg.data.in_memory_max_gb, device, packed_runs())
        )
    )


def check_sizes(
    cfg: Config, task: Task, datasets: Datasets, denv: distributed.DistEnv
) -> int | None:
    """Check the first samples and the settings that depend on the data; batches per epoch.

    A stream has no length: None, and without `train.max_steps` the run has no planned end.
    """
    for split in ("train", "val"):
        check_first_sample(
            datasets.get(split), f"task {task.name}: {split} data set", own_collate(task)
        )
    if cfg.run.best_metric and cfg.run.best_metric not in task.metrics:
        raise ConfigError(
            f"run.best_metric: {cfg.run.best_metric!r} is not a metric of task {task.name} "
            f"(one of {list(task.metrics)})"
        )
    if is_stream(datasets.train):
        if cfg.train.schedule == "cosine" and not cfg.train.max_steps:
            raise ConfigError(
                f"train.schedule: 'cosine' decays to zero at the last step, and task "
                f"{task.name}'s train split is a stream with no length: set train.max_steps, "
                "or train.schedule='constant'"
            )
        return None
    train_size, accum = size(datasets.train), cfg.train.grad_accum_steps
    batches = train_size // denv.world_size // cfg.train.batch_size
    if batches // accum == 0:
        per_process = train_size // denv.world_size
        fits = (
            f"train.grad_accum_steps={batches} fits, or a smaller train.batch_size"
            if batches
            else f"train.batch_size={per_process} fits"
        )
        cut = " (shorter windows, task.context, give more)" if "context" in cfg.task.options else ""
        raise ConfigError(
            f"train.batch_size: {cfg.train.batch_size} x {denv.world_size} processes x "
            f"{accum} accumulation steps exceeds the {train_size} training samples{cut}; {fits}"
        )
    return batches


def plan_steps(cfg: Config, batches_per_epoch: int | None) -> tuple[int | None, int | None]:
    """Optimizer steps per epoch and in all: None where unknown (a stream; no max_steps)."""
    per_epoch = (
        None if batches_per_epoch is None else batches_per_epoch // cfg.train.grad_accum_steps
    )
    limits = [cfg.train.max_steps] if cfg.train.max_steps else []
    if per_epoch is not None:
        limits.append(per_epoch * cfg.train.epochs)
    return per_epoch, min(limits, default=None)
