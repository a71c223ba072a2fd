"""W&B and MLflow tracking, offline: one tracked run across a stop and a resume.

Each backend's tests are skipped when its extra is not installed. Nothing here reaches the
network: W&B runs in its default offline mode, MLflow writes its file store under runs/.
"""

import re
from pathlib import Path

import pytest

from conftest import blobs, pkg

trainer = pkg("engine.loop.trainer")
checkpoint = pkg("engine.state.checkpoint")
tracking = pkg("observe.tracking")

FAST = ["run.progress=log", "run.figures=false", "run.log_every_steps=2", "data.verify_raw=false"]
SECRET = "wandb-key-3f9a1c7e5b2d4068"  # noqa: S105  (a stand-in API key that must never reach a file)


def train_in_segments(kind: str, name: str) -> list[str]:
    """Train in segments of 5 steps until finished; return the tracker run id of each segment."""
    task = blobs(
        *FAST, f"run.name={name}", f"run.tracking={kind}", "train.batch_size=64",
        "train.epochs=2", "run.max_steps_this_segment=5",
    )  # fmt: skip
    ids, status = [], ""
    while status != "finished":
        result = trainer.train(task.cfg, task)
        status = result.summary["status"]
        state = checkpoint.load_latest(result.run_dir / "checkpoints")
        assert state is not None
        assert state["tracker"]["kind"] == kind
        ids.append(state["tracker"]["run_id"])
    return ids


@pytest.fixture
def offline(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with tracker settings at their defaults and an API key in the environment."""
    for var in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return project


def assert_secret_not_written(project: Path) -> None:
    for path in (project / "runs").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_wandb_offline_run_survives_stop_and_resume(offline: Path) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    ids = train_in_segments("wandb", "wb")
    assert len(ids) == 3  # 12 steps in segments of 5
    assert len(set(ids)) == 1, ids
    # One offline folder per segment, all of the same run: `wandb sync` uploads them in order.
    folders = list((offline / "runs" / "wb" / "wandb").glob("offline-run-*"))
    assert len(folders) == 3
    assert all(re.fullmatch(rf"offline-run-[\d_]+-{ids[0]}(-\d+)?", f.name) for f in folders)
    # The records W&B will upload (protobuf; names and JSON values are stored as written).
    records = [next(folder.glob("*.wandb")).read_bytes() for folder in folders]
    assert all(b"train/loss" in r for r in records)
    assert sum(b'"epochs":2' in r for r in records) == 3  # the config, each segment
    last = [r for r in records if b'"finished"' in r]  # the summary of the final segment
    assert len(last) == 1
    assert all(key in last[0] for key in (b"val_loss", b"wall_s", b"compute_share"))
    assert_secret_not_written(offline)


def test_mlflow_file_store_run_survives_stop_and_resume(offline: Path) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    ids = train_in_segments("mlflow", "ml")
    assert len(ids) == 3
    assert len(set(ids)) == 1, ids
    store = offline / "runs" / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run(ids[0])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "ml"
    assert run.data.params["train.epochs"] == "2"
    assert run.data.tags["summary.status"] == "finished"
    assert {"summary/val_loss", "summary/wall_s", "summary/data_share"} <= set(run.data.metrics)
    steps = [m.step for m in client.get_metric_history(ids[0], "train/loss")]
    assert steps == [2, 4, 6, 8, 10, 12]  # all three segments, no step twice
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments])
    assert [r.info.run_id for r in runs] == ids[:1]  # a resume made no second run
    assert_secret_not_written(offline)


def test_a_stopped_mlflow_segment_is_scheduled_not_finished(offline: Path) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    task = blobs(*FAST, "run.name=seg", "run.tracking=mlflow", "run.max_steps_this_segment=3")
    result = trainer.train(task.cfg, task)
    state = checkpoint.load_latest(result.run_dir / "checkpoints")
    assert state is not None
    client = MlflowClient(tracking_uri=(offline / "runs" / "mlruns").as_uri())
    assert client.get_run(state["tracker"]["run_id"]).info.status == "SCHEDULED"


def test_csv_and_tensorboard_save_no_tracker(project: Path) -> None:
    task = blobs(*FAST, "run.name=plain", "train.epochs=1")
    result = trainer.train(task.cfg, task)
    state = checkpoint.load_latest(result.run_dir / "checkpoints")
    assert state is not None
    assert state["tracker"] is None


def test_metric_names_carry_the_phase() -> None:
    row = {"step": 4, "epoch": 0, "phase": "val", "loss": 0.5, "accuracy": 1, "lr": ""}
    assert tracking.metric_values(row) == {"val/epoch": 0.0, "val/loss": 0.5, "val/accuracy": 1.0}
