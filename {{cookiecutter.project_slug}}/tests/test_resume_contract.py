"""What may change between segments of a run, what is refused, and what is said about it."""

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch

from conftest import blobs, pkg

trainer = pkg("engine.loop.trainer")
checkpoint = pkg("engine.state.checkpoint")
CheckpointError = pkg("errors").CheckpointError

FAST = ["run.progress=log", "run.figures=false", "run.log_every_steps=1", "data.verify_raw=false"]
CONSTANT = ["train.schedule=constant", "train.warmup_steps=0", "train.batch_size=32"]


def train(*overrides: str, **options: object):
    task = blobs(*FAST, *overrides, **options)
    return trainer.train(task.cfg, task)


def logged_lrs(run_dir: Path) -> dict[int, float]:
    with (run_dir / "metrics.csv").open() as f:
        return {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f) if r["phase"] == "train"}


def test_changed_lr_and_weight_decay_apply_from_the_resumed_step(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = ["run.name=lr", *CONSTANT, "train.epochs=1"]
    train(*first, "train.lr=0.01", "run.max_steps_this_segment=3")
    capsys.readouterr()
    train(*first, "train.lr=0.02", "train.weight_decay=0.05")
    out = capsys.readouterr().out
    assert "train.lr: 0.01 -> 0.02" in out
    assert "train.weight_decay: 0.01 -> 0.05" in out
    assert "max_steps_this_segment" not in out  # the first segment's own cut: no change
    lrs = logged_lrs(project / "runs" / "lr")
    assert [lrs[s] for s in (1, 2, 3)] == [0.01] * 3
    assert {lrs[s] for s in range(4, 14)} == {0.02}
    state = checkpoint.load_latest(project / "runs" / "lr" / "checkpoints")
    decays = [g["weight_decay"] for g in state["optimizer"]["param_groups"]]
    assert decays == [0.05, 0.0]  # the second group: parameters without decay


def test_unchanged_config_reports_no_change(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run.name=same", *CONSTANT, "train.epochs=1", "run.max_steps_this_segment=3"]
    train(*args)
    train(*args)
    assert "config changed" not in capsys.readouterr().out


def test_settings_of_one_segment_are_no_change_of_the_run() -> None:
    """Each start takes its own cut, profile, progress display and debug output."""
    old = {"run": {"max_steps_this_segment": 10, "profile_steps": 5, "progress": "bar"}}
    new = {"run": {"max_steps_this_segment": 0, "profile_steps": 0, "progress": "log"}}
    old["run"] |= {"debug": True, "seed": 0}
    new["run"] |= {"debug": False, "seed": 1}
    assert trainer._config_changes(old, new) == ["run.seed: 0 -> 1"]


def test_config_sections_added_since_the_checkpoint_are_reported() -> None:
    old = {"train": {"lr": 0.1}}
    new = {"train": {"lr": 0.1}, "extra": {"k": 1}}
    assert trainer._config_changes(old, new) == ["extra.k: None -> 1"]


def test_changed_accumulation_never_carries_gradients_into_the_next_epoch(project: Path) -> None:
    # 13 batches of 32 per epoch. After 5 single-batch steps, steps of 3 batches cover
    # batches 5-7, 8-10 and leave 11-12: those two must not reach the next epoch's first step.
    args = ["run.name=accum", "train.batch_size=32", "train.epochs=2"]
    train(*args, "run.max_steps_this_segment=5")
    task = blobs(*FAST, *args, "train.grad_accum_steps=3")
    left_over = []
    start_epoch = task.on_epoch_start

    def record(model: torch.nn.Module, epoch: int) -> None:
        left_over.append(any(p.grad is not None for p in model.parameters()))
        start_epoch(model, epoch)

    task.on_epoch_start = record
    result = trainer.train(task.cfg, task)
    assert result.summary["status"] == "finished"
    assert left_over == [False, False]  # epochs 0 (resumed) and 1
    assert result.summary["step"] == 5 + 2 + 4


def test_changed_parameter_groups_are_one_line(project: Path) -> None:
    args = ["run.name=groups", "train.batch_size=32", "train.epochs=1"]
    train(*args, "run.max_steps_this_segment=2")
    with pytest.raises(CheckpointError, match="parameter groups changed"):
        train(*args, first_lr=0.01)


def test_a_resume_on_changed_processed_data_is_one_line(project: Path) -> None:
    data = pkg("data.processed")
    args = ["run.name=data", "train.batch_size=32", "train.epochs=1"]
    task = blobs(*FAST, *args, "run.max_steps_this_segment=2")
    data.prepare(task)  # nothing prepared, but a SHA256SUMS (of no files) all the same
    trainer.train(task.cfg, task)
    record = json.loads((project / "runs" / "data" / "provenance.jsonl").read_text())
    assert record["processed_sha256"] == data.processed_digest(task.processed_dir)
    (task.processed_dir / "split.pt").write_bytes(b"another split")  # prepare ran again
    data.write_digests(task.processed_dir)
    with pytest.raises(pkg("errors").DataError, match=r"other data: processed/.*/split.pt is new"):
        train(*args)


def test_changed_model_under_the_same_run_name_is_one_line(project: Path) -> None:
    args = ["run.name=model", "train.batch_size=32", "train.epochs=1"]
    train(*args, "model.hidden=32", "run.max_steps_this_segment=2")
    with pytest.raises(CheckpointError, match=r"weights do not fit .* was the model"):
        train(*args, "model.hidden=16")


def test_evaluate_on_the_cpu_after_fp16_training(project: Path) -> None:
    train("run.name=half", "train.batch_size=32", "train.epochs=1")
    run_dir = project / "runs" / "half"
    [(step, path)] = checkpoint.list_checkpoints(run_dir / "checkpoints")[-1:]
    state = {**checkpoint.load(path)}  # a copy: the file is memory-mapped
    state["config"]["train"]["precision"] = "fp16"  # as written by a run on a GPU
    run_id = checkpoint.read_manifest(path)["run_id"]
    checkpoint.save(state, run_dir / "checkpoints", step, keep=1, run_id=run_id)
    result = pkg("engine.loop.evaluate").evaluate_run(
        run_dir, pkg("settings").get_settings(), "cpu"
    )
    assert result["accuracy"] > 0.5


def test_checkpoints_with_an_earlier_releases_sha256_record_resume_and_are_checked(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run.name=old", "train.batch_size=32", "train.epochs=1", "run.keep_checkpoints=2"]
    train(*args, "run.max_steps_this_segment=2")
    train(*args, "run.max_steps_this_segment=2")
    [(_, first), (_, latest)] = checkpoint.list_checkpoints(project / "runs/old/checkpoints")
    for path in (first, latest):  # the record as releases before xxh3 wrote it
        record = json.loads(checkpoint.manifest_path(path).read_text())
        assert set(record) == {"run_id", "seconds", "xxh3_128"}
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        record = {"run_id": record["run_id"], "sha256": {path.name: sha}}
        checkpoint.manifest_path(path).write_text(json.dumps(record))
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 1  # one flipped bit: the older checkpoint is taken
    latest.write_bytes(data)
    capsys.readouterr()
    train(*args, "run.max_steps_this_segment=1")
    said = "".join(capsys.readouterr())
    assert f"skipping a checkpoint: {latest}: checksum mismatch" in said
    assert said.count("skipping a checkpoint") == 1  # the first one, with its SHA-256, loaded
    assert checkpoint.load_latest(project / "runs/old/checkpoints")["position"]["step"] == 3


def test_recorded_scalars_are_interval_means_exact_across_a_resume(project: Path) -> None:
    load = pkg("task").load_config
    args = ["task.name=toy_tasks.contrastive", *FAST, "run.log_every_steps=5", "train.epochs=1"]
    args += ["train.batch_size=16"]  # 32 steps
    cut = [*args, "run.name=cut"]
    assert trainer.train(load(None, [*cut, "run.max_steps_this_segment=7"])).exit_code == 0
    assert trainer.train(load(None, cut)).exit_code == 0
    assert trainer.train(load(None, [*args, "run.name=straight"])).exit_code == 0

    def rows(run: str) -> list[tuple[str, str, str]]:
        with (project / "runs" / run / "metrics.csv").open() as f:
            return [
                (r["step"], r["loss"], r["top1"])
                for r in csv.DictReader(f)
                if r["phase"] == "train"
            ]

    assert rows("cut") == rows("straight") and len(rows("cut")) == 6  # steps 5, 10, ..., 30
    assert all(0 <= float(top1) <= 1 for *_, top1 in rows("cut"))
    with (project / "runs" / "cut" / "metrics.csv").open() as f:
        assert next(csv.reader(f))[3:6] == ["loss", "recall1", "top1"]  # metrics, then scalars


def test_recording_an_undeclared_scalar_is_one_line(project: Path) -> None:
    task = blobs(*FAST)
    with pytest.raises(pkg("errors").DataError, match=r"record\('acc'\): add 'acc' to the task's"):
        task.record("acc", 1.0)


def test_metrics_rows_are_the_runs_not_the_segments(project: Path) -> None:
    args = ["train.batch_size=32", "train.epochs=2", "run.log_every_steps=5"]
    train(*args, "run.name=cut", "run.max_steps_this_segment=7")  # stops mid-window
    train(*args, "run.name=cut")
    train(*args, "run.name=straight")

    def rows(run: str) -> list[dict[str, str]]:
        with (project / "runs" / run / "metrics.csv").open() as f:
            return [r for r in csv.DictReader(f) if r["phase"] == "train"]

    cut, straight = rows("cut"), rows("straight")
    # The row after the resume averages steps 6-10, as the uninterrupted run's does.
    assert [(r["step"], r["loss"]) for r in cut] == [(r["step"], r["loss"]) for r in straight]
    elapsed = [float(r["elapsed_s"]) for r in cut]
    assert elapsed == sorted(elapsed)  # the run's time: it does not restart with a segment
