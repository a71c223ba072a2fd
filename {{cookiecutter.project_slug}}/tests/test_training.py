"""Training in this process: learning, exact resume, both batch paths, files of a run."""

import csv
import itertools
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import assert_identical, blobs, final_weights, pkg
from toy_tasks.blobs import Blobs, NoisyDicts

config = pkg("config")
trainer = pkg("engine.loop.trainer")
checkpoint = pkg("engine.state.checkpoint")

FAST = ["run.progress=log", "run.figures=false", "run.log_every_steps=5", "data.verify_raw=false"]


def cfg_with(*overrides: str):
    return pkg("task").load_config(None, [*FAST, *overrides])


def train(*overrides: str, **options: object):
    """Train the test task (blobs) with `overrides` and task `options`."""
    task = blobs(*FAST, *overrides, **options)
    return trainer.train(task.cfg, task)


def test_example_beats_chance_and_writes_the_run_files(digits_project: Path) -> None:
    cfg = cfg_with("run.name=example", "train.epochs=8", "run.figures=true", "task.name=digits")
    result = trainer.train(cfg)
    run_dir = digits_project / "runs" / "example"
    assert result.exit_code == 0
    assert result.summary["status"] == "finished"
    assert result.summary["val_accuracy"] > 0.9  # chance is 0.1
    assert pkg("task").load_config(run_dir / "config.toml") == cfg
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 8 * 11
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows if r["phase"] == "val"] == [str(11 * e) for e in range(1, 9)]
    assert len(checkpoint.list_checkpoints(run_dir / "checkpoints")) == cfg.run.keep_checkpoints
    figures = digits_project / "reports" / "figures" / "example"
    assert (figures / "curves.png").stat().st_size > 1000
    assert (figures / "confusion_matrix.png").stat().st_size > 1000

    code = pkg("cli").main(["evaluate", "--run", "example"])
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert code == 0
    assert evaluation["split"] == "test"
    assert evaluation["accuracy"] > 0.9
    assert (figures / "confusion_matrix_test.png").is_file()


@pytest.mark.parametrize(
    "variant",
    [
        ["data.in_memory=yes"],
        ["data.in_memory=no", "data.num_workers=0"],
        ["train.grad_accum_steps=2"],
        ["task.samples=dicts", "data.num_workers=2"],
    ],
    ids=["in-memory", "dataloader", "accumulation", "dict-samples-augmented-2-workers"],
)
def test_resume_mid_epoch_gives_bit_identical_weights(project: Path, variant: list[str]) -> None:
    # 420 training samples: 13 batches of 32 per epoch
    common = [
        "train.batch_size=32",
        "train.epochs=3",
        "model.hidden=32",
        "run.deterministic=true",
        *variant,
    ]
    train("run.name=straight", *common)

    # Three segments, each stopping mid-epoch, each resuming from the checkpoint of the last.
    for _ in range(3):
        segment = train("run.name=resumed", "run.max_steps_this_segment=7", *common)
    assert segment.summary["status"] in {"segment", "finished"}
    last = train("run.name=resumed", *common)
    assert last.summary["status"] == "finished"
    assert_identical(
        final_weights(project / "runs" / "straight"), final_weights(project / "runs" / "resumed")
    )

    with (project / "runs" / "resumed" / "metrics.csv").open() as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["phase"] == "train"]
    assert steps == sorted(set(steps))  # no duplicated rows after resuming


def test_in_memory_and_dataloader_paths_train_identically(project: Path) -> None:
    common = ["train.batch_size=32", "train.epochs=2", "model.hidden=32"]
    fast = train("run.name=fast", "data.in_memory=yes", *common)
    train("run.name=loader", "data.in_memory=no", "data.num_workers=0", *common)
    assert fast.summary["val_accuracy"] > 0.9  # four classes: chance is 0.25
    assert_identical(
        final_weights(project / "runs" / "fast"), final_weights(project / "runs" / "loader")
    )


def test_segments_and_finished_runs(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run.name=seg", "train.batch_size=64", "train.epochs=2", "run.max_steps_this_segment=5"]
    first = train(*args)
    assert (first.exit_code, first.summary["status"], first.summary["step"]) == (0, "segment", 5)
    assert "segment done at step 5" in capsys.readouterr().out
    while train(*args).summary["status"] != "finished":
        pass
    again = train(*args)
    assert again.summary["step"] == 12  # 6 steps per epoch
    assert "already finished" in capsys.readouterr().out


def test_throughput_after_a_resume_counts_this_segment_only(project: Path) -> None:
    args = ["run.name=speed", "train.batch_size=64", "train.epochs=2"]
    args.append("run.max_steps_this_segment=4")
    train(*args)
    second = train(*args).summary
    assert (second["step"], second["samples"]) == (8, 4 * 64)  # not the 8 x 64 of the run
    busy = second["data_s"] + second["compute_s"]  # each rounded to 1 ms
    low, high = 4 * 64 / (busy + 0.001) - 0.1, 4 * 64 / (busy - 0.001) + 0.1
    assert low <= second["samples_per_s"] <= high


def test_a_background_save_due_while_the_last_writes_is_skipped_and_said_once(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first background save is held on the disk until three later ones fell due."""
    checkpoint, checkpoint_io = pkg("engine.state.checkpoint"), pkg("engine.state.checkpoint_io")
    disk_free, steps = threading.Event(), []
    real_save, real_skip = checkpoint.save, checkpoint_io.Checkpointer.skip

    def slow_disk(state: dict[str, Any], *args: Any, **kwargs: Any) -> Path:
        steps.append(state["position"]["step"])
        if len(steps) == 1:
            disk_free.wait(timeout=600)  # released by the third skip (a bound only if broken)
        return real_save(state, *args, **kwargs)

    def skip(self: Any, step: int, writing: bool) -> bool:
        skipped = real_skip(self, step, writing)
        if self.skipped == 3:
            disk_free.set()
        return skipped

    monkeypatch.setattr(checkpoint, "save", slow_disk)
    monkeypatch.setattr(checkpoint_io.Checkpointer, "skip", skip)
    args = ["run.async_checkpoint=true", "run.checkpoint_every_steps=2", "train.batch_size=64"]
    result = train("run.name=skips", "train.epochs=2", *args)
    assert result.summary["status"] == "finished"
    assert disk_free.is_set() and steps[0] == 2 and {4, 6, 8}.isdisjoint(steps), steps
    assert steps[-1] == result.summary["step"]  # the last save is written, never skipped
    said = capsys.readouterr().out
    assert said.count("is skipped") == 1, said
    assert "the checkpoint due at step 4 is skipped" in said and "checkpoint_every_minutes" in said


def test_a_save_too_slow_for_the_stop_grace_is_said_once_and_first_on_resume(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STOP_GRACE_S", "0.0001")  # as the job script sets it; any save is slower
    args = ["run.name=grace", "train.batch_size=32", "train.epochs=1"]
    train(*args, "run.max_steps_this_segment=3", "run.checkpoint_every_steps=1")
    said = capsys.readouterr().out
    assert said.count("the stop's save may be cut off") == 1, said  # three saves, one line
    assert "the stop signal comes 0.0001 s before the limit" in said
    train(*args)  # the resumed segment says it before its first step, from the saved record
    lines = capsys.readouterr().out.splitlines()
    warned = [i for i, line in enumerate(lines) if "the stop's save may be cut off" in line]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert len(warned) == 1 and warned[0] < first_step, lines
    monkeypatch.setenv("STOP_GRACE_S", "300")
    train("run.name=calm", "train.batch_size=32", "train.epochs=1")
    assert "warning: checkpoints" not in capsys.readouterr().out


def test_outputs_kept_beyond_the_limit_stop_the_run_with_one_line(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchmetrics", reason="the metrics extra is not installed")
    task = blobs(*FAST, "run.name=kept", "train.epochs=1")
    task.add_metrics("auroc")  # every validation sample's probabilities and label, kept
    assert task.metrics == ("loss", "accuracy", "auroc")
    with monkeypatch.context() as limited:  # not monkeypatch.undo(): it unsets PROJECT_ROOT
        limited.setattr(type(task), "keep_limit_mb", 0.001)  # 1 kB: 4 x 4 B x 60 samples
        with pytest.raises(pkg("errors").DataError, match=r"more than keep_limit_mb = 0.001 MB"):
            trainer.train(task.cfg, task)
    task = blobs(*FAST, "run.name=auroc", "train.epochs=1")
    task.add_metrics("auroc")
    result = trainer.train(task.cfg, task)
    assert 0.5 < result.summary["val_auroc"] <= 1


def test_time_report_shares_add_up_to_the_wall_time(project: Path) -> None:
    summary = train("run.name=shares", "train.epochs=1")
    shares = {k: v for k, v in summary.summary.items() if k.endswith("_share")}
    assert set(shares) == {f"{k}_share" for k in ("data", "compute", "checkpoint", "eval", "other")}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert "  other " in pkg("observe.metrics").format_summary(summary.summary)


def _too_slow(signum: int, frame: object) -> None:
    raise TimeoutError("training did not finish in time (a loop without progress?)")


def test_resume_with_a_larger_batch_at_an_epoch_end_goes_on_to_the_next_epoch(
    project: Path,
) -> None:
    common = ["run.name=rescaled", "train.epochs=2", "model.hidden=32"]  # 420 training samples
    # Batch 10: 42 steps per epoch; stop after 41, before the epoch's last step.
    first = train(*common, "train.batch_size=10", "run.max_steps_this_segment=41")
    assert (first.summary["epoch"], first.summary["step"]) == (0, 41)
    # Batch 100 has 4 steps per epoch, and the 410 samples done cover all 4 of them.
    previous = signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(30)  # a few seconds when it works
    try:
        resumed = train(*common, "train.batch_size=100")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert resumed.summary["status"] == "finished"
    assert (resumed.summary["epoch"], resumed.summary["step"]) == (2, 41 + 4)


class PidDicts(NoisyDicts):
    """Samples that carry the id of the process that loaded them."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {**super().__getitem__(i), "pid": torch.tensor(os.getpid())}


class ValPids(Blobs):
    """Blobs (dict samples) whose evaluation records which processes loaded its batches."""

    pids: set[int]

    def datasets(self, data_dir: Path) -> Any:
        sets = super().datasets(data_dir)
        sets.val = PidDicts(sets.val.x, sets.val.y, sets.val.noise)
        return sets

    def evaluate(self, model: Any, batch: Any) -> dict[str, torch.Tensor]:
        self.pids.update(batch.pop("pid").tolist())
        return super().evaluate(model, batch)


def test_validation_workers_serve_every_pass_and_end_with_training(project: Path) -> None:
    args = ["task.samples=dicts", "data.num_workers=2", "train.epochs=3", "train.batch_size=32"]
    cfg = pkg("task").load_config(
        None, ["task.name=toy_tasks.blobs", *FAST, *args, "run.name=pids"]
    )
    task = ValPids(cfg, pkg("settings").get_settings())
    task.pids = set()
    trainer.train(task.cfg, task)
    assert (project / "runs" / "pids" / "metrics.csv").read_text().count(",val,") == 3
    # Three passes, two worker processes: the same two served every pass.
    assert len(task.pids) == 2 and os.getpid() not in task.pids
    for pid in task.pids:  # shut down and reaped when training ended
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_batch_larger_than_data_is_a_config_error(project: Path) -> None:
    with pytest.raises(pkg("errors").ConfigError, match=r"train\.batch_size"):
        train("train.batch_size=4096")


def test_lr_schedule_warms_up_then_decays() -> None:
    factors = [
        pkg("engine.optim").lr_factor(s, warmup=4, total=20, schedule="cosine") for s in range(20)
    ]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in itertools.pairwise(factors[3:]))
    assert factors[-1] < 0.01


def test_tensorboard_tracking_writes_event_files(project: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    train("run.name=tb", "run.tracking=tensorboard", "train.epochs=1")
    assert list((project / "runs" / "tb" / "tensorboard").glob("events.out.tfevents.*"))


def test_checkpoints_by_wall_clock_between_epoch_ends(project: Path) -> None:
    train(
        "run.name=clock",
        "train.batch_size=16",
        "train.epochs=2",
        "run.keep_checkpoints=100",
        "run.checkpoint_every_minutes=0.00001",  # well under one step
    )
    steps = [s for s, _ in checkpoint.list_checkpoints(project / "runs" / "clock" / "checkpoints")]
    assert len(steps) > 2 * 2  # far more than the two epoch ends
    assert any(s % 26 for s in steps)  # 26 steps per epoch: these are not epoch ends
