"""The training loop: one function, `train`, from configuration to checkpoints and figures.

Read top to bottom: set-up (devices, process group, data, model), resume, the loop, the end.
The loop only does work a hand-written loop would do; logging happens every `log_every_steps`
steps, and the ranks agree on stops and due checkpoints with a vote that never waits for the
GPU (`distributed.StepVote`). Everything that belongs to the research problem (data, model,
loss, metrics, figures) is asked of the task (task.py); nothing here needs an edit for a new
problem.
"""

import datetime
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...config import PER_SEGMENT, Config, to_dict, to_toml
from ...data.failures import ReadError, ReadFailure
from ...data.processed import stage
from ...errors import CheckpointError, ConfigError, DataError
from ...observe import provenance
from ...observe.metrics import (
    MetricsLog,
    Progress,
    Timers,
    format_summary,
    metric_fields,
    whole_run,
)
from ...observe.plots import plot_curves
from ...settings import Settings, get_settings
from ...task import Datasets, Task, Where, load_task, model_figures_seeded, own_collate
from .. import hooks, names
from ..parallel import distributed, strategy
from ..parallel.preemption import (
    EXIT_DIVERGED,
    EXIT_REQUEUE,
    StopRequest,
    catch_stop_signals,
    stop_message,
)
from ..parallel.runtime import (
    billed_gpus,
    configure_backends,
    default_workers,
    limit_threads,
    packed_runs,
    pick_device,
    seed_everything,
    threads_note,
)
from ..state import Checkpointer, lock_run_dir, remove_stale_tmp, run_id, save_atomic
from . import read_stop
from .averaging import swapped_in
from .batches import EvalBatches, make_train_batches
from .evaluate import split_sums
from .loading import Loading
from .rng import rng_state, set_rng_state
from .run_data import RunData
from .sizes import check_sizes, in_memory, plan_steps
from .stream_batches import StreamBatches
from .train_scalars import TrainScalars
from .update import Update


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
    names.check_given(cfg.run.name, env.get("RUN_NAME", ""))  # one folder below runs/
    if cfg.run.name:
        return cfg.run.name
    if env.get("RUN_NAME"):
        return env["RUN_NAME"]
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"]
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")  # local time on purpose


def _config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` of each setting of the run that differs (PER_SEGMENT's are not)."""
    return [
        f"{section}.{key}: {old.get(section, {}).get(key)!r} -> {value!r}"
        for section, table in new.items()
        for key, value in table.items()
        if old.get(section, {}).get(key) != value and f"{section}.{key}" not in PER_SEGMENT
    ]


def train(
    cfg: Config,
    task: Task | None = None,
    settings: Settings | None = None,
    check_raw: Callable[[], None] | None = None,
) -> Result:
    """Train (or resume) the run named by the configuration.

    Without `task` the configured one is loaded; its processed data is read after rank 0 has
    run `check_raw` (the raw-data verification) and told the other ranks its verdict.
    """
    settings = settings or get_settings()
    task = task or load_task(cfg, settings)
    denv = distributed.resolve_env()
    if hint := distributed.warn_unlaunched(os.environ, denv):
        print(f"warning: {hint}", flush=True)
    configure_backends(cfg.run.deterministic)
    limit_threads(denv)
    device = pick_device(cfg.train.device, denv)
    # From here on a stop signal only sets the flag, also during the (slow) set-up.
    with catch_stop_signals() as stop:
        distributed.init(denv, device, cfg.dist.backend, cfg.dist.timeout_minutes)
        try:
            datasets = _load_checked(task, cfg, denv, check_raw)
            trainer = Trainer(cfg, task, datasets, settings=settings, denv=denv, device=device)
            with trainer:
                result = trainer.run(stop)
            # Rank 0 has reported: the ranks end together (srun --wait), and no collective is
            # still being torn down in gloo's threads when the group is destroyed.
            distributed.barrier()
            return result
        finally:
            distributed.shutdown()


def _load_checked(
    task: Task, cfg: Config, denv: distributed.DistEnv, check_raw: Callable[[], None] | None
) -> Datasets:
    problem = None
    if denv.is_main and check_raw is not None:
        try:
            check_raw()
        except Exception as err:  # re-raised below, on every rank
            problem = str(err)
    if problem := distributed.broadcast_object(problem):
        raise DataError(problem)
    data_dir, problem = task.processed_dir, None
    try:
        data_dir = stage(task.processed_dir, cfg, denv.local_rank)
    except DataError as err:
        problem = str(err)
    # Also the barrier: every local rank 0 has finished staging (untimed: copying is slow).
    if problems := [p for p in distributed.gather_objects(problem, io=True) if p]:
        raise DataError(problems[0])
    return task.datasets(data_dir)


def closing_line(
    outcome: str, stop: StopRequest, run: str, steps: tuple[int, int], idle: bool
) -> str:
    """What the end of a segment says ("" for a finished one).

    `steps`: the step reached and the newest checkpoint's (-1: none); `idle`: resumed, and
    no step done.
    """
    step, saved = steps
    if outcome == "diverged":
        kept = f"step {saved}" if saved >= 0 else "none"
        return (
            f"error: the loss or the weights became NaN/inf by step {step}; stopped with "
            f"exit {EXIT_DIVERGED}, the last finite checkpoint is {kept} "
            "(lower train.lr, or raise train.nonfinite_patience)"
        )
    lines = {
        "stop": stop_message(stop.signal_name, step, run),
        "segment": f"segment done at step {step}; the next start resumes",
        "pruned": f"run {run}: pruned at step {step} (the sweep's pruner)",
        "": f"run {run}: already finished at step {step}" if idle else "",
    }
    return lines.get(outcome, "")


class Trainer:
    """State of one training process; `run` is the loop.

    Use it in a `with` block: leaving the block shuts the DataLoader workers down, whichever
    way training ends.
    """

    def __init__(
        self,
        cfg: Config,
        task: Task,
        datasets: Datasets,
        *,
        settings: Settings,
        denv: distributed.DistEnv,
        device: torch.device,
    ) -> None:
        """Build model, optimizer, schedule and batches (no files are touched yet)."""
        self.cfg, self.task, self.datasets, self.settings = cfg, task, datasets, settings
        self.denv, self.device = denv, device
        self.say: Callable[[str], None] = (
            partial(print, flush=True) if denv.is_main else (lambda _: None)
        )
        self.name = distributed.broadcast_object(run_name(cfg, os.environ))
        self.run_dir = settings.runs_dir / self.name
        self.ckpt_dir = self.run_dir / "checkpoints"

        train_set = datasets.train
        # A task's own collate makes every batch: never the in-memory path, which has none.
        self.in_memory = own_collate(task) is None and in_memory(cfg, task.name, train_set, device)
        self.workers = cfg.data.num_workers if cfg.data.num_workers >= 0 else default_workers(denv)
        self.accum = cfg.train.grad_accum_steps
        self.batches_per_epoch = check_sizes(cfg, task, datasets, denv)  # None: a stream
        self.steps_per_epoch, self.total_steps = plan_steps(cfg, self.batches_per_epoch)
        self.global_batch = cfg.train.batch_size * denv.world_size * self.accum
        # Batches of an epoch, per process; a stream's epoch ends when it runs out.
        spe = self.steps_per_epoch
        self.epoch_batches = spe * self.accum if spe is not None else math.inf
        self.data = RunData(task, datasets.train, settings, denv)  # digests, the source record

        seed_everything(cfg.run.seed)  # identical initial weights on every rank
        self.strategy = strategy.create(cfg, denv, device)  # ddp or fsdp: nothing else knows
        self.net, self.model = self.strategy.setup(task)
        self.checkpoints = Checkpointer(
            self.ckpt_dir,
            self.strategy,
            denv,
            cfg.run.keep_checkpoints,
            self.say,
            every_s=60 * cfg.run.checkpoint_every_minutes,
        )
        # Optimizers, schedules, scaling and the task's step hooks: the update rule's room.
        self.update = Update(
            cfg,
            task,
            strategy=self.strategy,
            models=(self.net, self.model),
            total_steps=self.total_steps,
            device=device,
        )
        self.dtype = self.update.dtype
        seed_everything(cfg.run.seed + denv.rank)  # distinct dropout streams per rank

        self.log_every = cfg.run.log_every_steps
        self.pos = Position()
        self.nonfinite_windows = 0  # logging windows in a row with a NaN/inf loss
        self.best: float | None = None  # best value of run.best_metric so far
        self.earlier: dict[str, float] = {}  # seconds per activity of the earlier segments
        self.timers = Timers()
        # GPU-seconds (the whole_run's gpu_s, for `compare`) accrue at this many per second.
        self.gpus = billed_gpus(device, denv.world_size)
        self._held = ExitStack()  # the run directory's lock
        self.saved_step, self.saved_time = -1, time.monotonic()
        self.metrics: MetricsLog | None = None
        self.tracker_saved: dict[str, str] | None = None  # W&B/MLflow run to continue
        self.last_val: dict[str, float] = {}
        self.last_sums: dict[str, torch.Tensor] = {}
        self.vote = distributed.StepVote()
        self.pruned = ""  # "pruned": a listener (a sweep's pruner) stopped the run
        # Last: the DataLoader workers start here, so nothing above can leave them behind.
        # Validation keeps its own workers from pass to pass (they start with its first).
        loading = Loading.of(cfg, denv, device, self.workers, own_collate(task))
        self.val_batches = EvalBatches(datasets.val, loading, where=f"task {task.name}: val")
        where = f"task {task.name}: train"
        self.batches = make_train_batches(
            train_set, loading, in_memory=self.in_memory, group=self.accum, where=where
        )

    def __enter__(self) -> "Trainer":
        """Lock the run directory (rank 0; every rank learns whether that worked)."""
        problem = None
        if self.denv.is_main:
            try:
                self._held.enter_context(lock_run_dir(self.run_dir, self.say))
            except ConfigError as err:
                problem = str(err)
        if problem := distributed.broadcast_object(problem):
            self.batches.close()
            self.val_batches.close()
            raise ConfigError(problem)
        return self

    def __exit__(self, *_exc: object) -> None:
        """Finish a background save, shut the DataLoader workers down, close the metrics, unlock."""
        self.checkpoints.close()
        self.batches.close()
        self.val_batches.close()
        if self.metrics is not None:  # closed by `report` already, unless training failed
            self.metrics.close()
        # DDP's reducer holds the process group. Dropped here, before the group is destroyed,
        # it is not the group's last owner: gloo's destructor joins threads that may need the
        # GIL, and in a reducer's teardown that deadlocked the process at exit.
        self.model = self.net
        self.strategy.release()
        self._held.close()

    # --- checkpoints --------------------------------------------------------------------
    def resume(self) -> bool:
        """Load the newest checkpoint of this run, if any; return whether one was found."""
        self.window = TrainScalars(self.device, self.update.scalars)
        self.data.check()
        if self.denv.is_main:
            remove_stale_tmp(self.ckpt_dir)
        distributed.barrier(io=True)  # deleting a large stale folder may take a while
        own_id = run_id(self.run_dir) if self.denv.is_main else None
        self.checkpoints.run_id = distributed.broadcast_object(own_id)
        reading = time.perf_counter()
        state = self.checkpoints.load_latest(self.net, self.update)
        if state is None:
            self.say(f"run {self.name}: no checkpoint in {self.ckpt_dir}, starting fresh")
            if self.strategy.initial:  # read into the model when it was built
                self.say(f"initial weights from {self.strategy.initial.path}")
            return False
        if state["config"].get("task", {}).get("name", "digits") != self.task.name:
            raise ConfigError(
                f"task.name: run {self.name} was trained with task "
                f"{state['config']['task']['name']!r}, not {self.task.name!r}: use another run.name"
            )
        self.data.same_as(state, self.name, self.run_dir)
        if state.get("strategy", "ddp") != self.strategy.name:
            raise CheckpointError(
                f"dist.strategy: run {self.name}'s checkpoint was written with "
                f"{state.get('strategy', 'ddp')!r}; resume it with that strategy"
            )
        source = f"run {self.name}'s checkpoint"
        self.update.restore(
            state, self.name, partial(self.strategy.load, self.net, self.update, state, source)
        )
        self.pos = Position(**state["position"])
        self.tracker_saved = state.get("tracker")
        self.saved_step = self.pos.step
        self.best, self.earlier = state.get("best"), state.get("seconds", {})
        self.restore_order(state)
        for change in _config_changes(state["config"], to_dict(self.cfg)):
            self.say(f"note: config changed since the checkpoint, applies from here: {change}")
        resharded = (
            f", written by {state['world_size']} process(es), resharded to {self.denv.world_size}"
            if self.strategy.sharded and state["world_size"] != self.denv.world_size
            else ""
        )
        self.say(
            f"run {self.name}: resumed from step {self.pos.step} "
            f"(epoch {self.pos.epoch}, batch {self.pos.batch}{resharded}) "
            f"in {time.perf_counter() - reading:.1f} s"
        )
        return True

    def restore_order(self, state: dict[str, Any]) -> None:
        """The random state and position within the epoch after the checkpoint's step.

        Unchanged process count and batch size: the exact random state and sample order.
        Otherwise the position moves to the same share of the epoch. A changed accumulation
        keeps the order; when less than one full step is left the next epoch begins.
        """
        batch_size, world = self.cfg.train.batch_size, self.denv.world_size
        if isinstance(self.batches, StreamBatches):  # its own position, the same split only
            self.batches.restore([saved.get("stream") for saved in state["rng"]], self.name)
        if state["world_size"] == world and state["batch_size"] == batch_size:
            set_rng_state(state["rng"][self.denv.rank])
            saved = state["rng"][self.denv.rank]
            if "loss_window" in saved:  # a checkpoint of release 0.2: the loss's sum only
                saved["train_scalars"] = {"loss": saved["loss_window"]}
            self.window.load(saved.get("train_scalars", {}))
        else:  # keep the position within the epoch, not the exact sample order
            done = self.pos.batch * state["batch_size"] * state["world_size"]
            self.pos.batch = done // (batch_size * world) // self.accum * self.accum
            self.say("warning: process count or batch size changed; this epoch's order changes")
        per_epoch = self.batches_per_epoch
        if per_epoch is not None and self.pos.batch + self.accum > per_epoch:  # no full step left
            self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0

    def save_checkpoint(self, background: bool = False, writing: bool = False) -> bool:
        """Write a checkpoint for the current step (every rank calls this).

        Returns False, writing nothing, when the weights are no longer finite: the last
        finite checkpoint is never replaced by a diverged one. `background`: written while
        training goes on, when `run.async_checkpoint` is set, or skipped while the previous
        background save is still `writing` (as the ranks voted).
        """
        if self.saved_step == self.pos.step:
            return True
        background = background and self.cfg.run.async_checkpoint
        if background and self.checkpoints.skip(self.pos.step, writing):
            self.saved_time = time.monotonic()  # the next one falls due a full interval later
            return True
        if not self.strategy.all_finite(self.net):
            return False
        start = time.perf_counter()
        # Each process's random state, and its part of the next train row's means.
        window = self.window.state()
        rngs = distributed.gather_objects(
            {**rng_state(self.device), "train_scalars": window, "stream": self.batches.state()}
        )
        frozen = self.strategy.frozen_keys(self.net)
        digest = self.strategy.frozen_digest(self.net, frozen) if frozen else ""
        extra = {
            **self.update.state(),  # schedules, the gradient scaler
            "position": asdict(self.pos),
            "rng": rngs,
            "world_size": self.denv.world_size,
            "batch_size": self.cfg.train.batch_size,
            "config": to_dict(self.cfg),
            **self.data.checkpointed(),
            "best": self.best,
            "seconds": self.run_seconds(),
            "tracker": self.metrics.tracker_state() if self.metrics else None,
            "strategy": self.strategy.name,
            "frozen": {"keys": frozen, "digest": digest} if frozen else None,
        }
        self.checkpoints.save(self.pos.step, self.net, self.update, extra, background)
        self.saved_step, self.saved_time = self.pos.step, time.monotonic()
        self.timers.add("checkpoint", start)
        return True

    # --- one step -----------------------------------------------------------------------
    def where(self) -> Where:
        """Where training is, for the task (`Task.where`)."""
        total = self.total_steps
        return Where(self.pos.step, self.pos.epoch, self.pos.step / total if total else None)

    def optimizer_step(self, log_now: bool) -> None:
        """The update rule's step (clip, step, clear, schedule, `after_step`), then the position.

        The gradient norm is kept for the log (`log_now`); it stays on the device until then.
        """
        self.update.step(log_now, self.window, self.pos.step + 1)
        self.pos.step += 1
        self.pos.batch += self.accum
        self.pos.samples += self.global_batch

    def validate(self) -> None:
        """The task's metrics on the validation split, logged as a `val` row."""
        start = time.perf_counter()
        with swapped_in(self.task.averaged, self.net):  # best.pt holds what validation used
            self.last_sums = split_sums(
                self.task,
                self.net,
                self.datasets.val,
                denv=self.denv,
                device=self.device,
                dtype=self.dtype,
                workers=self.workers,
                lockstep=self.strategy.sharded,
                feed=self.val_batches,
            )
            self.last_val = self.task.summarize(self.last_sums)
            self.keep_best()
        prune = self.denv.is_main and hooks.validated(self.pos.step, self.last_val)
        self.pruned = "pruned" if distributed.broadcast_object(prune) else ""
        self.timers.add("eval", start)
        if self.metrics is not None:
            self.metrics.write(
                step=self.pos.step,
                epoch=self.pos.epoch,
                phase="val",
                **self.last_val,
                elapsed_s=round(self.run_seconds()["wall"], 3),  # the whole run's, all segments
            )

    def keep_best(self) -> None:
        """`run.best_metric`: rank 0 writes the weights to best.pt when the metric improved."""
        name = self.cfg.run.best_metric
        value = self.last_val.get(name, math.nan) if name else math.nan
        if not math.isfinite(value):
            return
        lower = self.cfg.run.best_mode == "min"
        if self.best is not None and not (value < self.best if lower else value > self.best):
            return  # only a strict improvement replaces the best
        self.best = value
        weights = self.strategy.full_weights(self.net)  # fsdp: gathered onto rank 0
        frozen = self.strategy.frozen_keys(self.net)  # left out, as in checkpoints
        digest = self.strategy.frozen_digest(self.net, frozen) if frozen else ""
        if self.denv.is_main:
            best = {"model": weights, "step": self.pos.step, name: value}
            best["frozen"] = {"keys": frozen, "digest": digest} if frozen else None
            save_atomic({**best, "config": to_dict(self.cfg)}, self.run_dir / "best.pt")
        self.checkpoints.barrier()  # the others wait for the write outside any timed collective

    def run_seconds(self) -> dict[str, float]:
        """Seconds per activity, wall and GPU-seconds of the run: earlier segments and this."""
        wall = time.perf_counter() - self.timers.start
        now = {"wall": wall, **self.timers.seconds, "gpu": wall * self.gpus}
        return {key: self.earlier.get(key, 0.0) + value for key, value in now.items()}

    def decide(self, stop_requested: bool, epoch_done: bool, segment_steps: int) -> str:
        """After a step: checkpoint if due; return "stop", "segment", "diverged" or ""."""
        minutes, every = self.cfg.run.checkpoint_every_minutes, self.cfg.run.checkpoint_every_steps
        before_end = self.total_steps is None or self.pos.step < self.total_steps
        segment = 0 < self.cfg.run.max_steps_this_segment <= segment_steps and before_end
        planned = epoch_done or segment or (every > 0 and self.pos.step % every == 0)
        # Every rank acts on the same step, at most one step after any rank saw the flag.
        stop, time_due, writing = self.vote.poll(
            [
                stop_requested,
                minutes > 0 and time.monotonic() - self.saved_time > 60 * minutes,
                self.checkpoints.writing(),
            ]
        )
        # The save before an exit is written at once; the others may go to the background.
        due = planned or stop or time_due
        if due and not self.save_checkpoint(not (stop or segment), writing):
            return "diverged"
        if stop and before_end:  # a signal after the last step: done
            return "stop"
        return "segment" if segment else ""

    # --- the loop -----------------------------------------------------------------------
    def run(self, stop: StopRequest) -> Result:
        """Resume, train to the end (or to a stop signal or segment end), report."""
        resumed = self.resume()
        if self.denv.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(self.cfg), encoding="utf-8")
            provenance.record(
                self.run_dir,
                self.settings.project_root,
                os.environ,
                self.data.digest,
                self.pos.step,
            )
            lr_names = [name.removeprefix("lr_") for name in self.update.lrs() if name != "lr"]
            fields = metric_fields(self.task.metrics, lr_names, self.update.scalars)
            self.metrics = MetricsLog(
                self.run_dir,
                self.cfg.run.tracking,
                self.pos.step,
                fields,
                config=to_dict(self.cfg),
                tracker=self.tracker_saved,
            )
        feed = "in-memory batches" if self.in_memory else f"DataLoader, {self.workers} workers"
        self.say(
            f"run {self.name}: {self.denv.world_size} process(es) via {self.denv.launcher}, "
            f"device {self.device}, precision {self.dtype or torch.float32}, {feed}, "
            f"{self.plan_note()}, "
            f"global batch {self.global_batch}, {threads_note()}"
        )
        progress = Progress(
            self.cfg.run.progress,
            self.total_steps,
            self.pos.step,
            self.cfg.run.log_every_steps,
            self.denv.is_main,
        )
        self.timers, first_samples, first_step = Timers(), self.pos.samples, self.pos.step
        failure: ReadFailure | None = None
        try:
            outcome, segment_steps = self._loop(progress, stop)
        except ReadError as failed:  # on every process, after the same (last good) step
            outcome, segment_steps, failure = "data", self.pos.step - first_step, failed.failure
        self.vote.settle()
        progress.close()
        saves = outcome != "diverged" and (outcome != "data" or segment_steps > 0)
        if saves and not self.save_checkpoint():  # no-op when saved already
            outcome = "diverged"
        kept = (self.saved_step, segment_steps)
        said, damaged = self.data.ended(failure, outcome == "data", self.run_dir, kept)
        self.checkpoints.barrier()  # a background save is complete before the run reports
        if not outcome and self.cfg.run.figures and not self.last_sums:
            self.validate()  # a finished run started again: its figures need the sums
        steps, idle = (self.pos.step, self.saved_step), resumed and segment_steps == 0
        for line in (said, closing_line(outcome, stop, self.name, steps, idle)):
            if line:
                self.say(line)
        status = {"stop": "stopped", "segment": "segment", "data": "data-failed"}.get(
            outcome, outcome or "finished"
        )  # and "diverged" and "pruned" (a sweep's pruner) stay as they are
        summary = {
            "run": self.name,
            "status": status,
            "step": self.pos.step,
            "epoch": self.pos.epoch,
            "total_steps": self.total_steps,
            "gpus": self.gpus,  # billed GPUs of this segment (a share when packed)
            "packed_runs": packed_runs(),  # runs that shared the GPU (slurm/pack.sbatch)
            **{f"val_{key}": value for key, value in self.last_val.items()},
            # Throughput of this segment: its samples over its time, not the run's samples.
            **self.timers.summary(self.pos.samples - first_samples, self.device),
            "data_edges_s": round(self.batches.edge_s, 3),  # of data_s: a stream's pass edges
            "whole_run": whole_run(self.run_seconds(), self.pos.samples),
            **({"damaged": damaged} if damaged else {}),  # excused on resume (read_stop)
        }
        if self.denv.is_main:
            self.report(summary)
        codes = {"stop": EXIT_REQUEUE, "diverged": EXIT_DIVERGED, "data": read_stop.EXIT_DATA}
        code = codes.get(outcome, 0)
        return Result(code, self.run_dir, summary)

    def _loop(self, progress: Progress, stop: StopRequest) -> tuple[str, int]:
        """Epochs and steps: the outcome ("", "stop", "segment", "diverged") and steps done."""
        segment_steps, seen, clock = 0, self.pos.samples, time.perf_counter()
        window = self.window  # the train row's sums since the last one, across segments
        log_every, val_every = self.log_every, self.cfg.run.val_every_steps
        while self.pos.epoch < self.cfg.train.epochs and not self.at_end():
            self.task.on_epoch_start(self.net, self.pos.epoch)
            self.update.check_left_out()
            self.batches.set_epoch(self.pos.epoch)
            self.model.train()
            self.task.on_mode(self.net, True)
            micro, tick = 0, time.perf_counter()
            for batch in self.batches.iterate(self.pos.batch):
                tick = self.timers.add("data", tick)
                micro += 1
                self.update.add(batch, micro == self.accum, self.where(), window)
                if micro < self.accum:
                    tick = self.timers.add("compute", tick)
                    continue
                micro = 0
                log_now = (self.pos.step + 1) % log_every == 0
                self.optimizer_step(log_now)
                segment_steps += 1
                stats = None
                if log_now:  # wait for the GPU here only, so the time lands in "compute"
                    tick = self.timers.synchronized("compute", tick, self.device)
                    stats = {
                        **window.means(self.denv),  # the loss and the task's scalars
                        **self.update.lrs(),
                        "samples_per_s": (self.pos.samples - seen) / (tick - clock),
                    }
                    if self.update.grad_norm is not None:
                        stats["grad_norm"] = self.update.grad_norm.item()
                    window.reset()
                    seen, clock = self.pos.samples, tick
                    self.log_train(stats)
                    if self.diverged(stats["loss"]):
                        return "diverged", segment_steps
                else:
                    tick = self.timers.add("compute", tick)
                progress.update(self.pos.step, self.pos.epoch, stats)

                epoch_done = self.batches.ended or self.pos.batch >= self.epoch_batches
                last = epoch_done or self.at_end()
                if last or (val_every > 0 and self.pos.step % val_every == 0):
                    self.validate()
                    values = " ".join(f"{k} {v:.4f}" for k, v in self.last_val.items())
                    progress.message(f"epoch {self.pos.epoch} step {self.pos.step}: val {values}")
                if epoch_done:
                    self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0
                if outcome := self.decide(stop.requested, epoch_done, segment_steps) or self.pruned:
                    return outcome, segment_steps
                if last:
                    break
                tick = time.perf_counter()
            else:  # batches ran out before the epoch's last step: never retry the same epoch
                self.update.drop()  # no partial step into the next
                self.pos.epoch, self.pos.batch = self.pos.epoch + 1, 0
        return "", segment_steps

    def at_end(self) -> bool:
        """Whether `train.max_steps` are done (the epochs end the loop by themselves)."""
        return 0 < self.cfg.train.max_steps <= self.pos.step

    def plan_note(self) -> str:
        """The planned steps, as the start line says them."""
        if self.steps_per_epoch is None:
            end = f"until step {self.total_steps}" if self.total_steps else "no planned end"
            return f"a stream ({end})"
        return f"{self.total_steps} steps ({self.steps_per_epoch}/epoch)"

    def diverged(self, loss: float) -> bool:
        """Count logging windows with a NaN/inf loss; True after `train.nonfinite_patience`."""
        self.nonfinite_windows = 0 if math.isfinite(loss) else self.nonfinite_windows + 1
        return self.nonfinite_windows > self.cfg.train.nonfinite_patience

    def log_train(self, stats: dict[str, float]) -> None:
        """A `train` row in the metrics and a GPU utilisation sample."""
        self.timers.sample_gpu(self.device)
        if self.metrics is not None:
            self.metrics.write(
                step=self.pos.step,
                epoch=self.pos.epoch,
                phase="train",
                elapsed_s=round(self.run_seconds()["wall"], 3),  # the whole run's, all segments
                **stats,
            )

    def report(self, summary: dict[str, Any]) -> None:
        """Rank 0: summary.json, the time report, and figures when the run is finished."""
        assert self.metrics is not None  # created on rank 0
        self.metrics.close(summary)
        (self.run_dir / "summary.json").write_text(
            json.dumps(summary, indent=2) + "\n", encoding="utf-8"
        )
        hooks.ended(summary)
        self.say(format_summary(summary))
        if summary["status"] == "finished" and self.cfg.run.figures:
            figures = self.settings.figures_dir / self.name
            plot_curves(self.run_dir, figures, self.cfg.run.best_metric, self.cfg.run.best_mode)
            self.task.figures(self.last_sums, figures, "val")
            if not self.strategy.sharded:  # fsdp: `evaluate` draws them from the whole model
                with swapped_in(self.task.averaged, self.net):
                    model_figures_seeded(self.task, self.net, figures)
            self.say(f"figures: {figures}")
        self.say(f"run directory: {self.run_dir}")
