"""Seeing what happens: metrics files, progress output and where the time went.

Only rank 0 creates these objects' files. Progress is a tqdm bar on a terminal and plain,
grep-able log lines otherwise (Slurm output files), so a job log never fills with bar redraws.
"""

import contextlib
import csv
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .tracking import Tracker, open_tracker
from .tracking import state as tracker_state


def metric_fields(
    task_metrics: tuple[str, ...], lr_names: list[str], train_scalars: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The columns of metrics.csv: position, the task's metrics, learning rates, speed.

    The task's `train_scalars` (filled by train rows) follow its metrics (filled by val rows);
    a name that is both is one column, as "loss" is.
    """
    metrics = [m for m in task_metrics if m != "loss"]
    scalars = [s for s in train_scalars if s not in {"loss", *metrics}]
    return (
        "step",
        "epoch",
        "phase",
        "loss",
        *metrics,
        *scalars,
        "lr",
        *(f"lr_{name}" for name in lr_names),
        "grad_norm",
        "samples_per_s",
        "elapsed_s",
    )


class MetricsLog:
    """Rows to `metrics.csv` (always) and to TensorBoard, W&B or MLflow (when chosen)."""

    def __init__(
        self,
        run_dir: Path,
        tracking: str,
        resume_step: int,
        fields: tuple[str, ...],
        *,
        config: dict[str, Any] | None = None,
        tracker: dict[str, str] | None = None,
    ) -> None:
        """Open the CSV with `fields`; on resume drop rows logged after the checkpoint.

        `config` goes to a W&B/MLflow tracker; `tracker` (from the checkpoint) continues its run.
        """
        self.path = run_dir / "metrics.csv"
        kept: list[dict[str, str]] = []
        if resume_step > 0 and self.path.is_file():
            with self.path.open(newline="") as f:
                # A row cut off by a hard kill lacks fields (None); it is dropped too.
                rows = [r for r in csv.DictReader(f) if None not in r.values()]
                kept = [r for r in rows if int(r["step"]) <= resume_step]
        self.fields = fields
        # The kept history goes to a new file that replaces the old one in one rename, so a
        # kill during a resume never loses it; new rows are then appended.
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        tmp.replace(self.path)
        self._file = self.path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=fields, extrasaction="ignore")
        self._tb = None
        if tracking == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
            except ImportError:
                raise ConfigError(
                    "run.tracking = 'tensorboard' needs the extra: pip install -e '.[tensorboard]'"
                ) from None
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step)
        self.tracker: Tracker | None = open_tracker(tracking, run_dir, config or {}, tracker)

    def write(self, **row: Any) -> None:
        """Append one row; missing fields stay empty."""
        self._csv.writerow({k: row.get(k, "") for k in self.fields})
        self._file.flush()
        if self._tb is not None:
            for key in self.fields[3:]:
                if key != "elapsed_s" and isinstance(row.get(key), float):
                    self._tb.add_scalar(f"{row['phase']}/{key}", row[key], row["step"])
        if self.tracker is not None:
            self.tracker.log(row["step"], row)

    def tracker_state(self) -> dict[str, str] | None:
        """The W&B/MLflow run to continue after a requeue (saved in the checkpoint)."""
        return None if self.tracker is None else tracker_state(self.tracker)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Flush and close the files; `summary` (final metrics, time report) goes to a tracker.

        A second call does nothing.
        """
        if self._file.closed:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self.tracker is not None:
            self.tracker.summary(summary or {})
            self.tracker.close()


class Progress:
    """A tqdm bar (terminal) or a log line every `every` steps (files)."""

    def __init__(
        self, mode: str, total: int | None, initial: int, every: int, enabled: bool
    ) -> None:
        """`mode` is run.progress; `total` None: no planned end (no ETA); `enabled`: rank 0."""
        use_bar = mode == "bar" or (mode == "auto" and sys.stdout.isatty())
        self.every, self.enabled, self.total = every, enabled, total
        self.bar = None
        if enabled and use_bar:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, step: int, epoch: int, stats: dict[str, float] | None) -> None:
        """Advance by one step; `stats` is given on logging steps."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if stats:
                self.bar.set_postfix(epoch=epoch, loss=f"{stats['loss']:.4f}", refresh=False)
        elif stats:
            print(
                f"step {step}{f'/{self.total}' if self.total else ''} epoch {epoch} "
                f"loss {stats['loss']:.4f} "
                f"lr {stats['lr']:.2e} {stats['samples_per_s']:.0f} samples/s",
                flush=True,
            )

    def message(self, text: str) -> None:
        """A line that does not break the bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()


class Timers:
    """Wall-clock seconds spent per activity of the training loop."""

    def __init__(self) -> None:
        """All at zero; the clock for the total starts now."""
        self.seconds = {"data": 0.0, "compute": 0.0, "checkpoint": 0.0, "eval": 0.0}
        self.start = time.perf_counter()
        self.gpu_util: list[float] = []

    def add(self, key: str, since: float) -> float:
        """Add the time since `since` to `key`; return the current time."""
        now = time.perf_counter()
        self.seconds[key] += now - since
        return now

    def synchronized(self, key: str, since: float, device: torch.device) -> float:
        """Like `add`, after waiting for the GPU's queued work, so its time counts for `key`.

        CUDA calls return before the GPU has done the work; without this wait the work lands
        wherever the next synchronising call happens. The loop calls it at logging steps only.
        """
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return self.add(key, since)

    def sample_gpu(self, device: torch.device) -> None:
        """Record GPU utilisation from NVML when it is available."""
        if device.type != "cuda":
            return
        # Without NVML (pynvml) this raises; utilisation is then simply not reported.
        with contextlib.suppress(Exception):
            self.gpu_util.append(float(torch.cuda.utilization(device)))

    def summary(self, samples: int, device: torch.device) -> dict[str, Any]:
        """Totals, shares and throughput of this process's segment.

        `other` is the rest of the wall time, so the shares add up to one: logging, progress
        output and the stop decision. On GPUs the clocks are read after a synchronisation at
        every logging step, so queued GPU work counts as compute, not as other.
        """
        total = time.perf_counter() - self.start
        train = self.seconds["data"] + self.seconds["compute"]
        seconds = {**self.seconds, "other": max(0.0, total - sum(self.seconds.values()))}
        out: dict[str, Any] = {
            "wall_s": round(total, 3),
            "samples": samples,
            "samples_per_s": round(samples / train, 1) if train > 0 else 0.0,
            **{f"{k}_s": round(v, 3) for k, v in seconds.items()},
            **{f"{k}_share": round(v / total, 4) if total > 0 else 0.0 for k, v in seconds.items()},
        }
        if device.type == "cuda":
            out["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
            if self.gpu_util:
                out["gpu_util_mean_pct"] = round(sum(self.gpu_util) / len(self.gpu_util), 1)
        return out


def whole_run(seconds: dict[str, float], samples: int) -> dict[str, Any]:
    """Totals over every segment of a run (up to each one's last checkpoint) and this one.

    `gpu_s` is GPU-seconds: each segment's wall time times the GPUs it was charged for.
    """
    train = seconds.get("data", 0.0) + seconds.get("compute", 0.0)
    return {
        **{f"{key}_s": round(value, 3) for key, value in seconds.items()},
        "samples": samples,
        "samples_per_s": round(samples / train, 1) if train > 0 else 0.0,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The "where the time went" block printed at the end of `train`."""
    lines = [
        "where the time went:",
        *(
            f"  {key:<10} {summary[f'{key}_s']:9.2f} s  {100 * summary[f'{key}_share']:5.1f} %"
            for key in ("data", "compute", "checkpoint", "eval", "other")
        ),
        f"  total      {summary['wall_s']:9.2f} s  ({summary['samples_per_s']:.0f} samples/s)",
    ]
    if whole := summary.get("whole_run"):
        lines.append(
            f"  whole run  {whole['wall_s']:9.2f} s  ({whole['samples_per_s']:.0f} samples/s, "
            "all segments)"
        )
    if "peak_gpu_mem_gib" in summary:
        lines.append(f"  peak GPU memory {summary['peak_gpu_mem_gib']:.2f} GiB")
    if "gpu_util_mean_pct" in summary:
        lines.append(f"  GPU utilisation (NVML, mean of samples) {summary['gpu_util_mean_pct']} %")
    if warning := input_bound(summary):
        lines.append(warning)
    return "\n".join(lines)


def input_bound(summary: dict[str, Any]) -> str:
    """The warning when over 30 % of the step time waits for data, with the fix that applies.

    A stream's passes start and end with waits that more workers do not shorten: its workers
    start, and at the end they finish their share (`datasets` pauses 5 s at the end of each
    shuffled pass, in each worker). Where those waits (`data_edges_s`) are most of the data
    time, the warning says so; otherwise the workers are too slow or too few. A run stopped
    by a failed read says nothing: its time ended early.
    """
    data, busy = summary["data_s"], summary["data_s"] + summary["compute_s"]
    if busy <= 0 or data / busy <= 0.3 or summary.get("status") == "data-failed":
        return ""
    if (edges := summary.get("data_edges_s", 0.0)) > data / 2:
        return (
            f"  warning: input-bound at the edges of each pass: {edges:.1f} s of the "
            f"{data:.1f} s waiting for data, while a stream's workers started or finished a "
            "pass (datasets pauses at the end of each shuffled pass); more workers do not "
            "shorten these waits, longer epochs do (docs/bring-your-own-task.md, 'Streams')"
        )
    return (
        "  warning: input-bound, over 30 % of the step time waits for data: raise "
        "data.num_workers (and --cpus-per-task), use data.in_memory, or stage the data"
    )
