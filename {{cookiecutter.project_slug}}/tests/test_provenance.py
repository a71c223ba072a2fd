"""Provenance: each start of a run records the code, data and machine behind it."""

import csv
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from conftest import blobs, pkg

provenance = pkg("observe.provenance")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_record_names_commit_dirty_tree_manifest_job_and_versions(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    manifest = root / "data" / "raw.manifest.tsv"
    manifest.write_text("path\tsize\tsha256\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "one")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    run_dir = root / "runs" / "r1"
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "ggpu[01-02]", "HOME": "/x"}

    first = provenance.record(run_dir, root, env)
    (root / "notes.txt").write_text("uncommitted")  # the second segment runs a dirty tree
    second = provenance.record(run_dir, root, {**env, "SLURM_RESTART_COUNT": "1"})

    lines = [json.loads(ln) for ln in (run_dir / "provenance.jsonl").read_text().splitlines()]
    assert lines == [first, second]
    assert (first["commit"], first["dirty"]) == (head, False)
    assert (second["commit"], second["dirty"]) == (head, True)
    digest = provenance.file_digest(manifest)
    assert first["raw_manifest_sha256"] == digest and len(digest) == 64
    assert first["slurm"] == {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "ggpu[01-02]"}
    assert second["slurm"]["SLURM_RESTART_COUNT"] == "1"
    assert first["versions"]["torch"] and first["versions"]["python"]


def test_record_without_git_or_manifest_still_writes(tmp_path: Path) -> None:
    entry = provenance.record(tmp_path / "run", tmp_path, {})
    assert (entry["commit"], entry["dirty"], entry["raw_manifest_sha256"]) == (None, None, None)
    assert (tmp_path / "run" / "provenance.jsonl").is_file()


def test_the_curves_name_the_run_its_best_value_and_each_resume(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut at step 5 and resumed: one start record each, the figure marks step 5."""
    drawn: list[Figure] = []
    save = Figure.savefig

    def keep(fig: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.append(fig)
        save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    trainer = pkg("engine.loop.trainer")
    common = ["run.progress=log", "data.verify_raw=false", "run.name=cut", "train.epochs=2"]
    common += ["run.best_metric=accuracy", "run.best_mode=max", "run.log_every_steps=1"]
    cut = blobs(*common, "run.max_steps_this_segment=5", features=2, classes=3)
    trainer.train(cut.cfg, cut)
    rest = blobs(*common, features=2, classes=3)
    summary = trainer.train(rest.cfg, rest).summary
    run_dir = project / "runs" / "cut"
    starts = [json.loads(line) for line in (run_dir / "provenance.jsonl").read_text().splitlines()]
    assert [start["step"] for start in starts] == [0, 5]
    assert provenance.resumed_at(run_dir) == [5]

    curves = [fig for fig in drawn if fig.get_suptitle().startswith("run cut")]
    assert len(curves) == 1
    rows = list(csv.DictReader((run_dir / "metrics.csv").read_text().splitlines()))
    best = max(float(r["accuracy"]) for r in rows if r["phase"] == "val")
    assert f": best validation accuracy {best:.4g} at step " in curves[0].get_suptitle()
    assert best >= summary["val_accuracy"]  # the best, not the last
    for ax in curves[0].axes:  # the resume is marked on every panel
        marks = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert [line.get_xdata()[0] for line in marks if len(line.get_xdata())] == [5]
