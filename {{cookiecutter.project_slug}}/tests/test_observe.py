"""Time report, metrics file on resume, and the GPU-per-process rule."""

from pathlib import Path

import pytest
import torch

from conftest import pkg

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
    denv = pkg("engine.distributed").DistEnv(rank=3, local_rank=3, world_size=4, local_world_size=4)
    with pytest.raises(pkg("errors").ConfigError, match="one task per GPU"):
        pkg("engine.runtime").pick_device("cuda", denv)
