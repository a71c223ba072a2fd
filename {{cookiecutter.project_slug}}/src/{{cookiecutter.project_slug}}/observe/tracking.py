"""Experiment trackers beside `metrics.csv`: Weights & Biases and MLflow, offline first.

Compute nodes often have no internet, so both write locally by default: W&B in offline mode
into `runs/<name>/wandb/` (upload later from a login node with `wandb sync`), MLflow into a
file store `runs/mlruns/`. The tracker's run id is saved in every checkpoint (`state()`), so a
requeued or chained segment continues the same tracked run instead of starting a new one.
Settings come from the environment or `.env` only (WANDB_MODE, WANDB_PROJECT,
MLFLOW_TRACKING_URI, ...); API keys are read by the libraries themselves and never written.
Only rank 0 opens a tracker.
"""

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError

# The package name doubles as the W&B project and MLflow experiment name by default.
PROJECT = __name__.split(".", maxsplit=1)[0]
# Columns of a metrics row that are bookkeeping, not metrics.
_NOT_METRICS = {"step", "phase"}


class Tracker(Protocol):
    """What the training loop needs from an experiment tracker."""

    kind: str
    run_id: str

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Record the numbers of one metrics row (named `<phase>/<column>`) at `step`."""

    def summary(self, values: Mapping[str, Any]) -> None:
        """Record the end-of-segment summary: final metrics, the time report, the status."""

    def close(self) -> None:
        """Flush and release the tracker."""


def state(tracker: Tracker) -> dict[str, str]:
    """What a checkpoint keeps to continue this tracked run after a requeue."""
    return {"kind": tracker.kind, "run_id": tracker.run_id}


def open_tracker(
    kind: str, run_dir: Path, config: Mapping[str, Any], saved: Mapping[str, str] | None
) -> Tracker | None:
    """A tracker for `run.tracking = kind`, continuing `saved` (from a checkpoint) if given.

    Returns None for csv and tensorboard, which `observe.MetricsLog` writes itself.
    """
    run_id = saved["run_id"] if saved and saved.get("kind") == kind else None
    if kind == "wandb":
        return WandbTracker(run_dir, config, run_id)
    if kind == "mlflow":
        return MlflowTracker(run_dir, config, run_id)
    return None


def metric_values(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row, named `<phase>/<column>` (`train/loss`, `val/accuracy`)."""
    phase = row.get("phase")
    prefix = f"{phase}/" if phase else ""
    return {
        f"{prefix}{key}": float(value)
        for key, value in row.items()
        if key not in _NOT_METRICS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


def _missing(kind: str, package: str) -> ConfigError:
    return ConfigError(
        f"run.tracking = '{kind}' needs the {kind} extra: pip install -e '.[{kind}]' "
        f"(uv: uv sync --extra {kind}); {package} is not installed"
    )


class WandbTracker:
    """Weights & Biases: offline unless WANDB_MODE says otherwise."""

    kind = "wandb"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], run_id: str | None) -> None:
        """Start a run, or continue `run_id` (its config is updated, not replaced)."""
        try:
            import wandb  # noqa: PLC0415  (optional extra)
        except ImportError:
            raise _missing("wandb", "wandb") from None
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=run_dir.name,
            dir=run_dir,
            id=run_id,
            resume="allow",
            # Offline by default: compute nodes often have no internet (`wandb sync` later).
            mode=os.environ.get("WANDB_MODE") or "offline",
            config=dict(config),
            # The segment's console output is already in the Slurm log.
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run_id: str = self._run.id

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Log the row's numbers at `step` (W&B steps only grow; a resume continues them)."""
        self._run.log(metric_values(row), step=step)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Final metrics and the time report go to the run's summary."""
        self._run.summary.update(dict(values))

    def close(self) -> None:
        """Finish this segment; the next one resumes the same run id."""
        self._run.finish()


class MlflowTracker:
    """MLflow: a file store under the runs folder unless MLFLOW_TRACKING_URI names another."""

    kind = "mlflow"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], run_id: str | None) -> None:
        """Start a run with the config as parameters, or set `run_id` running again."""
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir.parent / "mlruns").as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store only on request. It is chosen here because each
            # run is its own folder: parallel jobs on a shared file system never contend for
            # one database file, and the light mlflow-skinny package suffices.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            from mlflow.entities import Param  # noqa: PLC0415  (optional extra)
            from mlflow.tracking import MlflowClient  # noqa: PLC0415
        except ImportError:
            raise _missing("mlflow", "mlflow-skinny") from None
        self._client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self._client.create_experiment(name)
            )
            run_id = self._client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            # Parameters are fixed once logged, so only a new run records the config.
            params = [Param(key, str(value)) for key, value in _flatten(config).items()]
            self._client.log_batch(run_id, params=params)
        else:
            self._client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Log the row's numbers at `step`."""
        from mlflow.entities import Metric  # noqa: PLC0415  (optional extra)

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in metric_values(row).items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Numbers become metrics at the final step, text becomes tags; the status is set."""
        step = int(values.get("step", 0))
        for key, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._client.log_metric(self.run_id, f"summary/{key}", float(value), step=step)
            else:
                self._client.set_tag(self.run_id, f"summary.{key}", str(value))
        # A stopped or segment-ended run continues in the next job: SCHEDULED, not FINISHED.
        status = "FINISHED" if values.get("status") == "finished" else "SCHEDULED"
        self._client.set_terminated(self.run_id, status=status)

    def close(self) -> None:
        """Nothing to flush: the client writes each call through."""


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"train": {"lr": 0.1}}` as `{"train.lr": 0.1}`."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
