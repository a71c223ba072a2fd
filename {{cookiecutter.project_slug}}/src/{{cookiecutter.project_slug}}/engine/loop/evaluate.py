"""Evaluation: the task's sums over a split, and the `evaluate` command (test split)."""

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ...config import Config
from ...data.failures import ReadError
from ...errors import CheckpointError, DataError
from ...settings import Settings
from ...task import (
    Task,
    config_from_dict,
    load_task,
    model_figures_seeded,
    own_collate,
    set_mode,
)
from ..parallel import distributed
from ..parallel.distributed import DistEnv
from ..parallel.runtime import autocast_dtype, pick_device
from ..state import RunWeights, load_latest, load_model, used_weights, with_frozen_base
from .batches import EvalBatches, size
from .loading import Loading
from .stream_batches import is_stream
from .transfer import to_device


class KeptOutputs:
    """What `Task.keep` got over one pass, on the CPU, within the task's `keep_limit_mb`."""

    def __init__(self, task: Task) -> None:
        """Nothing kept yet."""
        self.task, self.limit = task, task.keep_limit_mb * 1e6
        self.parts: dict[str, list[torch.Tensor]] = {}
        self.bytes, self.over = 0, False

    def add(self, kept: list[tuple[str, torch.Tensor]]) -> None:
        """One batch's kept rows (beyond the limit: nothing more, and `gathered` says so)."""
        for name, rows in kept:
            self.bytes += rows.numel() * rows.element_size()
            self.over = self.over or self.bytes > self.limit
            if self.over:
                self.parts.clear()  # the memory goes back at once; the pass ends with the error
                return
            self.parts.setdefault(name, []).append(rows.cpu())

    def gathered(self, denv: DistEnv) -> dict[str, torch.Tensor]:
        """Every process's rows per name, concatenated in rank order (on every process)."""
        mine = {name: torch.cat(rows) for name, rows in self.parts.items()}
        everyone = [(self.over, self.bytes, mine)]
        if denv.distributed:
            everyone = distributed.gather_objects(everyone[0])
        total = sum(size for _, size, _ in everyone)
        if any(over for over, _, _ in everyone) or total > self.limit:
            raise DataError(
                f"task {self.task.name}: the outputs kept in evaluate came to more than "
                f"keep_limit_mb = {self.task.keep_limit_mb:g} MB over the split: keep less "
                "per sample (a score, not the logits), fewer samples, or raise the task's "
                "keep_limit_mb"
            )
        names = sorted({name for _, _, kept in everyone for name in kept})
        return {n: torch.cat([kept[n] for _, _, kept in everyone if n in kept]) for n in names}


@torch.no_grad()
def split_sums(
    task: Task,
    model: nn.Module,
    dataset: Dataset,
    *,
    denv: DistEnv,
    device: torch.device,
    dtype: torch.dtype | None,
    workers: int,
    lockstep: bool = False,
    feed: EvalBatches | None = None,
) -> dict[str, torch.Tensor]:
    """The task's `evaluate` sums over every sample of `dataset`, added over all processes.

    With them, under their names, the per-sample rows the task kept (`Task.keep`) from every
    batch and process, concatenated.

    `denv` says which samples this process scores and whose sums are added; `DistEnv()`
    scores the whole split in this process alone, without any collective. Pass the unwrapped
    model: DDP's forward would sync buffers, and ranks may see different numbers of batches.
    `lockstep` (a sharded model, whose every forward gathers parameters from all processes):
    a process with fewer batches runs its last one again, unscored, until each has run as
    many forwards as rank 0, which has the most; otherwise rank 0 would wait forever.
    `feed`: the batches of `dataset`, kept by the caller so that its workers serve every pass.
    A batch that fails to read (`ReadError`) ends this process's pass; the processes then
    agree, and every one raises `ReadError` (the failure itself where it happened).
    """
    cfg = task.cfg
    set_mode(task, model, training=False)
    sums: dict[str, torch.Tensor] = {}
    own = feed is None  # a one-off pass (the `evaluate` command): its workers end with it
    feed = feed or EvalBatches(dataset, Loading.of(cfg, denv, device, workers, own_collate(task)))
    forwards, kept = 0, KeptOutputs(task)
    stream = is_stream(dataset)
    failed: ReadError | None = None
    try:
        for raw, scored in in_lockstep(feed) if lockstep and stream else ((b, True) for b in feed):
            batch = to_device(raw, device, cfg.model.channels_last)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                part = task.evaluate(model, batch)
            forwards += 1
            if not scored:  # a stream that ran out here, keeping the others company
                task.take_kept()
                continue
            kept.add(task.take_kept())
            for key, value in part.items():
                sums[key] = sums[key] + value.detach() if key in sums else value.detach().clone()
    except ReadError as err:  # told to the other processes below, after their passes
        failed = err
    finally:  # the trainer's own feed is closed by the trainer, on every way out
        if own:
            feed.close()
    # Rank r scores samples r, r + world, ...: rank 0 has the most, ceil(n / world).
    most = 0 if stream else math.ceil(-(-size(dataset) // denv.world_size) / cfg.train.batch_size)
    for _ in range(most - forwards if lockstep and forwards else 0):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            task.evaluate(model, batch)
        task.take_kept()  # unscored
    set_mode(task, model, training=True)
    anywhere = failed is not None
    if denv.distributed:  # every process learns whether one failed: all raise, or none
        anywhere = bool(distributed.most(int(anywhere)))
    if anywhere:
        raise failed or ReadError(None)
    return {**distributed.sum_tensors(sums, denv, device), **kept.gathered(denv)}


def in_lockstep(batches: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """(batch, scored) until every process has run out; one that ran out repeats its last.

    For a sharded model and a stream: every forward gathers parameters from all processes,
    and nobody knows in advance how many batches each stream holds, so they vote each batch.
    """
    last, source, failed = None, iter(batches), None
    while True:
        try:
            raw = next(source, None) if failed is None else None
        except ReadError as err:  # this process has run out: the others learn it at the end
            raw, failed = None, err
        if distributed.all_ranks(raw is None):
            if failed is not None:
                raise failed
            return
        if raw is None and last is None:
            raise DataError(
                "a stream gave this process no batch while others had some: "
                "give every process a share (see stream_part())"
            )
        last = raw if raw is not None else last
        yield last, raw is not None


def stream_samples(sums: dict[str, torch.Tensor]) -> int | None:
    """A stream's samples scored, from the `count` sum the ready-made kinds keep (else None)."""
    return int(sums["count"].item()) if "count" in sums else None


def load_run(run_dir: Path) -> tuple[Config, dict[str, Any]]:
    """The configuration and latest checkpoint of a finished or stopped run."""
    state = load_latest(run_dir / "checkpoints")
    if state is None:
        raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'}")
    return config_from_dict(state["config"]), state


def latest_run(runs_dir: Path) -> Path:
    """The most recently modified run directory."""
    runs = [p for p in runs_dir.glob("*/checkpoints") if p.is_dir()] if runs_dir.is_dir() else []
    if not runs:
        raise CheckpointError(f"no runs with checkpoints in {runs_dir}: train first")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def evaluate_run(run_dir: Path, settings: Settings, device_name: str = "auto") -> dict[str, Any]:
    """The task's metrics on the test split; writes `evaluation.json` and the task's figures."""
    cfg, state = load_run(run_dir)
    task = load_task(cfg, settings)
    datasets = task.datasets(task.processed_dir)
    device = pick_device(device_name, DistEnv())
    model = task.build_model().to(device)
    # A frozen base the checkpoint left out (LoRA) is read again from the run's model.init_from.
    frozen = list((state.get("frozen") or {}).get("keys", []))
    step = state["position"]["step"]
    found = RunWeights(used_weights(state), state["config"], step, run_dir, frozen)
    load_model(model, with_frozen_base(found, settings), f"run {run_dir.name}")
    sums = split_sums(
        task,
        model,
        datasets.test,
        denv=DistEnv(),
        device=device,
        dtype=autocast_dtype(cfg.train.precision, device, strict=False),
        workers=0,
    )
    result = {
        "run": run_dir.name,
        "task": cfg.task.name,
        "step": step,
        "split": "test",
        "samples": stream_samples(sums) if is_stream(datasets.test) else size(datasets.test),
        **task.summarize(sums),
    }
    (run_dir / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    out_dir = settings.figures_dir / run_dir.name
    figures = task.figures(sums, out_dir, "test") + model_figures_seeded(task, model, out_dir)
    return {**result, "figures": [str(f) for f in figures]}
