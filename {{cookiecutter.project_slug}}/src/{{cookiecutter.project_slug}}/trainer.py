"""The training loop: one function, `train`, from configuration to checkpoints and figures.

Read top to bottom: set-up (devices, process group, data, model), resume, the loop, the end.
The loop only does work a hand-written loop would do; everything else (logging, checkpoint and
stop decisions) happens every `log_every_steps` steps or at step boundaries.
"""

import datetime
import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint, distributed
from .batches import eval_batches, make_train_batches
from .config import Config, from_dict, to_dict, to_toml
from .data import Split, Splits, load_splits, processed_path, stage
from .errors import CheckpointError, ConfigError, DataError
from .models import build_model
from .observe import MetricsLog, Progress, Timers, format_summary
from .plots import confusion_matrix, plot_confusion, plot_curves
from .preemption import EXIT_REQUEUE, StopRequest, catch_stop_signals
from .runtime import (
    autocast_dtype,
    configure_backends,
    default_workers,
    limit_threads,
    pick_device,
    seed_everything,
)
from .settings import Settings, get_settings


@dataclass
class Position:
    """How far training got; saved in every checkpoint."""

    epoch: int = 0  # current epoch
    batch: int = 0  # batches of the current epoch already used (per process)
    step: int = 0  # optimizer steps
    samples: int = 0  # samples seen, all processes together


@dataclass
class Result:
    """What `train` reports back to the command line."""

    exit_code: int
    run_dir: Path
    summary: dict[str, Any]


def run_name(cfg: Config, env: Mapping[str, str]) -> str:
    """Name of the run: config run.name, RUN_NAME, Slurm array task, Slurm job id, else a timestamp.

    A requeued Slurm job keeps its id, so it finds its own run directory and resumes.
    """
    if cfg.run.name:
        return cfg.run.name
    if env.get("RUN_NAME"):
        return env["RUN_NAME"]
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")  # local time on purpose


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Linear warmup over `warmup` steps, then constant or cosine decay to zero at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def rng_state(device: torch.device) -> dict[str, Any]:
    """All random generator states of this process."""
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices and kernels only, not on biases and norm scales."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    split: Split,
    *,
    batch_size: int,
    denv: distributed.DistEnv,
    device: torch.device,
    dtype: torch.dtype | None,
) -> tuple[float, float, torch.Tensor]:
    """Mean loss, accuracy and this rank's predictions (in sample order) on a split.

    `denv` says which samples this process scores and whose sums are added; `DistEnv()`
    scores the whole split in this process alone, without any collective.

    Pass the unwrapped model: DDP's forward would sync buffers, and ranks may see different
    numbers of evaluation batches.
    """
    model.eval()
    loss_sum, correct, count, predictions = 0.0, 0.0, 0.0, []
    for x, y in eval_batches(split.x, split.y, batch_size, denv, device):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
        predicted = logits.argmax(dim=1)
        correct += (predicted == y).sum().item()
        count += len(y)
        predictions.append(predicted.cpu())
    model.train()
    loss_sum, correct, count = distributed.sum_across([loss_sum, correct, count], denv, device)
    return loss_sum / max(count, 1), correct / max(count, 1), torch.cat(predictions)


def _config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [
        f"{section}.{key}: {old[section].get(key)!r} -> {value!r}"
        for section, table in new.items()
        for key, value in table.items()
        if old.get(section, {}).get(key) != value
    ]


def train(
    cfg: Config,
    splits: Splits | None = None,
    settings: Settings | None = None,
    check_raw: Callable[[], None] | None = None,
) -> Result:
    """Train (or resume) the run named by the configuration.

    Without `splits` the processed data set is loaded, after rank 0 has run `check_raw`
    (the raw-data verification) and told the other ranks its verdict.
    """
    settings = settings or get_settings()
    denv = distributed.resolve_env()
    configure_backends(cfg.run.deterministic)
    limit_threads(denv)
    device = pick_device(cfg.train.device, denv)
    # From here on a stop signal only sets the flag, also during the (slow) set-up.
    with catch_stop_signals() as stop:
        distributed.init(denv, device, cfg.dist.backend, cfg.dist.timeout_minutes)
        try:
            if splits is None:
                splits = _load_checked(cfg, settings, denv, check_raw)
            return Trainer(cfg, splits, settings, denv, device).run(stop)
        finally:
            distributed.shutdown()


def _load_checked(
    cfg: Config, settings: Settings, denv: distributed.DistEnv, check_raw: Callable[[], None] | None
) -> Splits:
    problem = None
    if denv.is_main and check_raw is not None:
        try:
            check_raw()
        except Exception as err:  # re-raised below, on every rank
            problem = str(err)
    if problem := distributed.broadcast_object(problem):
        raise DataError(problem)
    path = stage(processed_path(cfg, settings), cfg, denv.local_rank)
    distributed.barrier()  # local rank 0 has finished staging
    return load_splits(path)


class Trainer:
    """State of one training process; `run` is the loop."""

    def __init__(
        self,
        cfg: Config,
        splits: Splits,
        settings: Settings,
        denv: distributed.DistEnv,
        device: torch.device,
    ) -> None:
        """Build batches, model, optimizer and schedule (no files are touched yet)."""
        self.cfg, self.splits, self.settings = cfg, splits, settings
        self.denv, self.device = denv, device
        self.say: Callable[[str], None] = (
            partial(print, flush=True) if denv.is_main else (lambda _: None)
        )
        self.name = distributed.broadcast_object(run_name(cfg, os.environ))
        self.run_dir = settings.runs_dir / self.name
        self.ckpt_dir = self.run_dir / "checkpoints"

        self.in_memory = cfg.data.in_memory == "yes" or (
            cfg.data.in_memory == "auto" and splits.nbytes <= cfg.data.in_memory_max_gb * 1e9
        )
        self.workers = cfg.data.num_workers if cfg.data.num_workers >= 0 else default_workers(denv)
        self.batches = make_train_batches(
            splits.train.x,
            splits.train.y,
            in_memory=self.in_memory,
            batch_size=cfg.train.batch_size,
            denv=denv,
            seed=cfg.run.seed,
            device=device,
            num_workers=self.workers,
            prefetch_factor=cfg.data.prefetch_factor,
        )
        self.accum = cfg.train.grad_accum_steps
        self.steps_per_epoch = len(self.batches) // self.accum
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"train.batch_size: {cfg.train.batch_size} x {denv.world_size} processes x "
                f"{self.accum} accumulation steps exceeds the {len(splits.train)} training samples"
            )
        self.total_steps = self.steps_per_epoch * cfg.train.epochs
        self.global_batch = cfg.train.batch_size * denv.world_size * self.accum

        seed_everything(cfg.run.seed)  # identical initial weights on every rank
        self.net = build_model(cfg.model, splits.input_shape, len(splits.classes)).to(device)
        if cfg.model.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.model: nn.Module = self.net
        if denv.distributed:
            ids = [device.index] if device.type == "cuda" else None
            self.model = DistributedDataParallel(self.net, device_ids=ids)
        if cfg.model.compile:
            self.model = torch.compile(self.model)
        self.optimizer = torch.optim.AdamW(
            param_groups(self.net, cfg.train.weight_decay),
            lr=cfg.train.lr,
            fused=device.type == "cuda",
        )  # one kernel for all parameters instead of many
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            partial(
                lr_factor,
                warmup=cfg.train.warmup_steps,
                total=self.total_steps,
                schedule=cfg.train.schedule,
            ),
        )
        self.dtype = autocast_dtype(cfg.train.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        seed_everything(cfg.run.seed + denv.rank)  # distinct dropout streams per rank

        self.pos = Position()
        self.timers = Timers()
        self.saved_step, self.saved_time = -1, time.monotonic()
        self.metrics: MetricsLog | None = None
        self.tracker_saved: dict[str, str] | None = None  # W&B/MLflow run to continue
        self.last_val: dict[str, float] = {}

    # --- checkpoints --------------------------------------------------------------------
    def resume(self) -> bool:
        """Load the newest checkpoint of this run, if any; return whether one was found."""
        if self.denv.is_main:
            checkpoint.remove_stale_tmp(self.ckpt_dir)
        distributed.barrier()
        state = checkpoint.load_latest(self.ckpt_dir)
        if state is None:
            self.say(f"run {self.name}: no checkpoint in {self.ckpt_dir}, starting fresh")
            return False
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.pos = Position(**state["position"])
        self.tracker_saved = state.get("tracker")
        self.saved_step = self.pos.step
        batch_size, world = self.cfg.train.batch_size, self.denv.world_size
        if state["world_size"] == world and state["batch_size"] == batch_size:
            set_rng_state(state["rng"][self.denv.rank])
        else:  # keep the position within the epoch, not the exact sample order
            done = self.pos.batch * state["batch_size"] * state["world_size"]
            self.pos.batch = done // (batch_size * world) // self.accum * self.accum
            self.say("warning: process count or batch size changed; this epoch's order changes")
            if self.pos.batch >= self.steps_per_epoch * self.accum:  # no full step left
                self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0
        for change in _config_changes(state["config"], to_dict(self.cfg)):
            self.say(f"note: config changed since the checkpoint: {change}")
        self.say(
            f"run {self.name}: resumed from step {self.pos.step} "
            f"(epoch {self.pos.epoch}, batch {self.pos.batch})"
        )
        return True

    def save_checkpoint(self) -> None:
        """Write a checkpoint for the current step (every rank calls this)."""
        start = time.perf_counter()
        rngs = distributed.gather_objects(rng_state(self.device))
        if self.denv.is_main and self.saved_step != self.pos.step:
            state = {
                "model": self.net.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "position": asdict(self.pos),
                "rng": rngs,
                "world_size": self.denv.world_size,
                "batch_size": self.cfg.train.batch_size,
                "config": to_dict(self.cfg),
                "tracker": self.metrics.tracker_state() if self.metrics else None,
            }
            checkpoint.save(state, self.ckpt_dir, self.pos.step, self.cfg.run.keep_checkpoints)
        self.saved_step, self.saved_time = self.pos.step, time.monotonic()
        distributed.barrier()
        self.timers.add("checkpoint", start)

    # --- one step -----------------------------------------------------------------------
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, sync: bool) -> torch.Tensor:
        """Loss of one micro-batch, gradients accumulated (all-reduced only when `sync`)."""
        no_sync = self.model.no_sync if self.denv.distributed and not sync else nullcontext
        if self.cfg.model.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with no_sync():
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
                loss = nn.functional.cross_entropy(self.model(x), y)
            self.scaler.scale(loss / self.accum if self.accum > 1 else loss).backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        """Clip, step, clear gradients, advance the schedule and the position."""
        if self.cfg.train.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.net.parameters(), self.cfg.train.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.pos.step += 1
        self.pos.batch += self.accum
        self.pos.samples += self.global_batch

    def validate(self) -> None:
        """Validation loss and accuracy, logged as a `val` row."""
        start = time.perf_counter()
        loss, acc, _ = evaluate_split(
            self.net,
            self.splits.val,
            batch_size=self.cfg.train.batch_size,
            denv=self.denv,
            device=self.device,
            dtype=self.dtype,
        )
        self.timers.add("eval", start)
        self.last_val = {"val_loss": loss, "val_accuracy": acc}
        if self.metrics is not None:
            self.metrics.write(
                step=self.pos.step,
                epoch=self.pos.epoch,
                phase="val",
                loss=loss,
                accuracy=acc,
                elapsed_s=round(time.perf_counter() - self.timers.start, 3),
            )

    def decide(self, stop_requested: bool, epoch_done: bool, segment_steps: int) -> str:
        """After a step: checkpoint if due; return "stop", "segment" or "" (continue)."""
        minutes, every = self.cfg.run.checkpoint_every_minutes, self.cfg.run.checkpoint_every_steps
        # One all-reduce makes every rank take the same decision at the same step.
        stop, time_due = distributed.any_rank(
            [
                stop_requested,
                minutes > 0 and time.monotonic() - self.saved_time > 60 * minutes,
            ],
            self.device,
        )
        segment = (
            0 < self.cfg.run.max_steps_this_segment <= segment_steps
            and self.pos.step < self.total_steps
        )
        if epoch_done or stop or time_due or segment or (every > 0 and self.pos.step % every == 0):
            self.save_checkpoint()
        if stop and self.pos.step < self.total_steps:  # a signal after the last step: done
            return "stop"
        return "segment" if segment else ""

    # --- the loop -----------------------------------------------------------------------
    def run(self, stop: StopRequest) -> Result:
        """Resume, train to the end (or to a stop signal or segment end), report."""
        resumed = self.resume()
        if self.denv.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(self.cfg), encoding="utf-8")
            self.metrics = MetricsLog(
                self.run_dir,
                self.cfg.run.tracking,
                self.pos.step,
                to_dict(self.cfg),
                self.tracker_saved,
            )
        feed = "in-memory batches" if self.in_memory else f"DataLoader, {self.workers} workers"
        self.say(
            f"run {self.name}: {self.denv.world_size} process(es) via {self.denv.launcher}, "
            f"device {self.device}, precision {self.dtype or torch.float32}, {feed}, "
            f"{self.total_steps} steps ({self.steps_per_epoch}/epoch), "
            f"global batch {self.global_batch}"
        )
        progress = Progress(
            self.cfg.run.progress,
            self.total_steps,
            self.pos.step,
            self.cfg.run.log_every_steps,
            self.denv.is_main,
        )
        self.timers, first_samples = Timers(), self.pos.samples
        outcome, segment_steps = self._loop(progress, stop)
        progress.close()
        self.save_checkpoint()  # no-op when this step is saved already
        if outcome == "stop":
            self.say(
                f"stop signal ({stop.signal_name or 'on another rank'}): checkpoint at step "
                f"{self.pos.step} written, exit {EXIT_REQUEUE} (requeue)"
            )
        elif outcome == "segment":
            self.say(f"segment done at step {self.pos.step}; the next start resumes")
        elif resumed and segment_steps == 0:
            self.say(f"run {self.name}: already finished at step {self.pos.step}")
        status = {"stop": "stopped", "segment": "segment"}.get(outcome, "finished")
        summary = {
            "run": self.name,
            "status": status,
            "step": self.pos.step,
            "epoch": self.pos.epoch,
            "total_steps": self.total_steps,
            **self.last_val,
            # Throughput of this segment: its samples over its time, not the run's samples.
            **self.timers.summary(self.pos.samples - first_samples, self.device),
        }
        if self.denv.is_main:
            self.report(summary)
        return Result(EXIT_REQUEUE if outcome == "stop" else 0, self.run_dir, summary)

    def _loop(self, progress: Progress, stop: StopRequest) -> tuple[str, int]:
        """Epochs and steps; returns the outcome ("", "stop", "segment") and steps done."""
        segment_steps, seen, clock = 0, self.pos.samples, time.perf_counter()
        loss_sum, loss_count = torch.zeros((), device=self.device), 0
        log_every = self.cfg.run.log_every_steps
        while self.pos.epoch < self.cfg.train.epochs:
            self.batches.set_epoch(self.pos.epoch)
            self.model.train()
            micro, tick = 0, time.perf_counter()
            for x, y in self.batches.iterate(self.pos.batch):
                tick = self.timers.add("data", tick)
                micro += 1
                loss_sum += self.forward_backward(x, y, sync=micro == self.accum)
                loss_count += 1
                if micro < self.accum:
                    tick = self.timers.add("compute", tick)
                    continue
                micro = 0
                self.optimizer_step()
                segment_steps += 1
                tick = self.timers.add("compute", tick)

                stats = None
                if self.pos.step % log_every == 0:
                    stats = {
                        "loss": loss_sum.item() / loss_count,
                        "lr": self.scheduler.get_last_lr()[0],
                        "samples_per_s": (self.pos.samples - seen) / (tick - clock),
                    }
                    loss_sum.zero_()
                    loss_count, seen, clock = 0, self.pos.samples, tick
                    self.log_train(stats)
                progress.update(self.pos.step, self.pos.epoch, stats)

                epoch_done = self.pos.batch >= self.steps_per_epoch * self.accum
                if epoch_done:
                    self.validate()
                    progress.message(
                        f"epoch {self.pos.epoch} step {self.pos.step}: "
                        f"val loss {self.last_val['val_loss']:.4f} "
                        f"acc {self.last_val['val_accuracy']:.4f}"
                    )
                    self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0
                if outcome := self.decide(stop.requested, epoch_done, segment_steps):
                    return outcome, segment_steps
                if epoch_done:
                    break
                tick = time.perf_counter()
            else:  # batches ran out before the epoch's last step: never retry the same epoch
                self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0
        return "", segment_steps

    def log_train(self, stats: dict[str, float]) -> None:
        """A `train` row in the metrics and a GPU utilisation sample."""
        self.timers.sample_gpu(self.device)
        if self.metrics is not None:
            self.metrics.write(
                step=self.pos.step,
                epoch=self.pos.epoch,
                phase="train",
                elapsed_s=round(time.perf_counter() - self.timers.start, 3),
                **stats,
            )

    def report(self, summary: dict[str, Any]) -> None:
        """Rank 0: summary.json, the time report, and figures when the run is finished."""
        assert self.metrics is not None  # created on rank 0
        self.metrics.close(summary)
        (self.run_dir / "summary.json").write_text(
            json.dumps(summary, indent=2) + "\n", encoding="utf-8"
        )
        self.say(format_summary(summary))
        if summary["status"] == "finished" and self.cfg.run.figures:
            figures = self.settings.figures_dir / self.name
            plot_curves(self.run_dir / "metrics.csv", figures)
            _, _, predicted = evaluate_split(
                self.net,
                self.splits.val,
                batch_size=self.cfg.train.batch_size,
                denv=distributed.DistEnv(),
                device=self.device,
                dtype=self.dtype,
            )
            matrix = confusion_matrix(self.splits.val.y, predicted, len(self.splits.classes))
            plot_confusion(matrix, self.splits.classes, figures, "validation split")
            self.say(f"figures: {figures}")
        self.say(f"run directory: {self.run_dir}")


def load_run(run_dir: Path) -> tuple[Config, dict[str, Any]]:
    """The configuration and latest checkpoint of a finished or stopped run."""
    state = checkpoint.load_latest(run_dir / "checkpoints")
    if state is None:
        raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'}")
    return from_dict(state["config"]), state
