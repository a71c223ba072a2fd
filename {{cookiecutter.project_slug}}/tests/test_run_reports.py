"""What a run reports: best weights, validation between epochs, gradient norm, whole-run time."""

import csv
from pathlib import Path

import pytest
import torch

from conftest import blobs, pkg

trainer = pkg("engine.loop.trainer")
checkpoint = pkg("engine.state.checkpoint")

FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "train.batch_size=32"]


def train(*overrides: str, **options: object):
    task = blobs(*FAST, *overrides, **options)
    return trainer.train(task.cfg, task)


def rows(run_dir: Path, phase: str) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["phase"] == phase]


@pytest.mark.parametrize(
    ("metric", "mode", "pick"), [("accuracy", "max", max), ("loss", "min", min)]
)
def test_best_weights_by_a_chosen_metric_validated_every_n_steps(
    project: Path, metric: str, mode: str, pick: object
) -> None:
    name = f"best-{mode}"
    args = [f"run.name={name}", f"run.best_metric={metric}", f"run.best_mode={mode}"]
    train(*args, "run.val_every_steps=4", "train.epochs=2", "train.lr=0.001")
    run_dir = project / "runs" / name
    val = rows(run_dir, "val")
    # Every 4 steps and at both epoch ends (13 steps per epoch).
    assert [int(r["step"]) for r in val] == [4, 8, 12, 13, 16, 20, 24, 26]
    best = torch.load(run_dir / "best.pt", weights_only=True)
    values = [float(r[metric]) for r in val]
    assert best[metric] == pytest.approx(pick(values))  # type: ignore[operator]
    first = next(r for r in val if float(r[metric]) == pytest.approx(best[metric]))
    assert best["step"] == int(first["step"])  # the first step that reached it
    pkg("engine.state.checkpoint").load_model(blobs(*FAST).build_model(), best["model"], "best.pt")


def test_best_metric_must_be_a_metric_of_the_task(project: Path) -> None:
    with pytest.raises(pkg("errors").ConfigError, match=r"run.best_metric: 'rmse' is not"):
        train("run.name=bad", "run.best_metric=rmse")


@pytest.mark.parametrize("clip", ["1.0", "0"])
def test_gradient_norm_and_every_learning_rate_are_logged(project: Path, clip: str) -> None:
    train("run.name=norms", "run.log_every_steps=2", f"train.grad_clip={clip}", first_lr=0.01)
    logged = rows(project / "runs" / "norms", "train")
    assert logged
    assert all(float(r["grad_norm"]) > 0 for r in logged)
    assert all(r["lr_first"] and r["lr_rest"] for r in logged)


def test_summary_covers_the_whole_run_and_the_segment(project: Path) -> None:
    args = ["run.name=whole", "train.epochs=2"]
    first = train(*args, "run.max_steps_this_segment=10").summary
    last = train(*args).summary
    assert first["whole_run"]["samples"] == first["samples"] == 10 * 32
    assert last["samples"] == (26 - 10) * 32  # this segment
    assert last["whole_run"]["samples"] == 26 * 32  # both
    assert last["whole_run"]["compute_s"] > last["compute_s"]
    assert last["whole_run"]["wall_s"] > last["wall_s"]
