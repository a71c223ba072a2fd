"""Time report, metrics file on resume, the GPU-per-process rule, and the figures' titles."""

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import blobs, pkg
from toy_tasks.blobs import Options as BlobsOptions

observe = pkg("observe.metrics")


def summary(data_s: float, compute_s: float) -> dict[str, float]:
    total = data_s + compute_s + 1.5
    parts = {"data": data_s, "compute": compute_s, "checkpoint": 0.5, "eval": 0.5, "other": 0.5}
    return {
        "wall_s": total,
        "samples_per_s": 1000.0,
        **{f"{k}_s": v for k, v in parts.items()},
        **{f"{k}_share": v / total for k, v in parts.items()},
    }


def test_time_report_warns_when_input_bound() -> None:
    slow = observe.format_summary(summary(data_s=4.0, compute_s=6.0))
    assert "input-bound, over 30 %" in slow and "raise data.num_workers" in slow
    quiet = observe.format_summary(summary(data_s=0.5, compute_s=9.5))
    assert "input-bound" not in quiet
    assert "data" in quiet
    assert "1000 samples/s" in quiet


def test_waits_at_a_streams_pass_edges_are_not_sent_to_more_workers() -> None:
    """datasets' pause at each shuffled pass's end: more workers would not shorten it."""
    paused = observe.format_summary({**summary(data_s=4.0, compute_s=6.0), "data_edges_s": 3.5})
    assert "input-bound at the edges of each pass: 3.5 s of the 4.0 s" in paused
    assert "num_workers" not in paused and "longer epochs" in paused
    spread = observe.format_summary({**summary(data_s=4.0, compute_s=6.0), "data_edges_s": 1.0})
    assert "raise data.num_workers" in spread
    stopped = {**summary(data_s=4.0, compute_s=6.0), "status": "data-failed"}
    assert "input-bound" not in observe.format_summary(stopped)  # its time ended early


def test_metrics_resume_drops_later_and_cut_off_rows(tmp_path: Path) -> None:
    fields = observe.metric_fields(("loss", "accuracy"), [])
    log = observe.MetricsLog(tmp_path, "csv", resume_step=0, fields=fields)
    for step in (10, 20, 30):
        log.write(step=step, epoch=0, phase="train", loss=1.0)
    log.close()
    with (tmp_path / "metrics.csv").open("a") as f:
        f.write("4")  # the start of a row a hard kill interrupted
    observe.MetricsLog(tmp_path, "csv", resume_step=20, fields=fields).close()
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ["step", "10", "20"]


def test_more_local_processes_than_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    denv = pkg("engine.parallel.distributed").DistEnv(
        rank=3, local_rank=3, world_size=4, local_world_size=4
    )
    with pytest.raises(pkg("errors").ConfigError, match="one task per GPU"):
        pkg("engine.parallel.runtime").pick_device("cuda", denv)


class Line(pkg("task_kinds").Regression):
    """A regression task with no data or model of its own: only its figures are drawn."""

    Options = BlobsOptions

    def datasets(self, data_dir: Path) -> Any:
        raise NotImplementedError

    def build_model(self) -> nn.Module:
        return nn.Identity()


def test_a_splits_figure_names_the_run_and_its_metric(
    project: Path, tmp_path: Path, drawn: list[Any]
) -> None:
    """`run 4711_3: test, accuracy 0.75`, not `test`: the figure says which run and how good."""
    task = blobs(classes=3)
    task.classes = ["a", "b", "c"]
    predicted = nn.functional.one_hot(torch.tensor([0, 1, 2, 1]), 3).float()  # 3 of 4 right
    sums = task.evaluate(nn.Identity(), (predicted, torch.tensor([0, 1, 2, 2])))
    task.figures(sums, tmp_path / "4711_3", "test")
    regression = Line(task.cfg, task.settings)
    targets = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]])
    sums = regression.evaluate(nn.Identity(), (targets + 0.5, targets))  # every error 0.5
    regression.figures(sums, tmp_path / "4711_4", "val")
    titles = [figure.axes[0].get_title() for figure in drawn]
    assert titles == ["run 4711_3: test, accuracy 0.75", "run 4711_4: val, rmse 0.5, r2 0.6"]
    assert (tmp_path / "4711_3" / "confusion_matrix_test.png").is_file()
