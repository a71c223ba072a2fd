"""Sweeps: a search space expands to named runs and one array; Optuna trials prune and resume.

Slurm is replaced by a fake `sbatch` that records its arguments; the array tasks of an Optuna
study run here one after another, each as `sweep --trial` with its array task's variables,
as slurm/sweep.sbatch starts them.
"""

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import pkg

cli, searchspace, hooks, trainer = (
    pkg("cli"),
    pkg("experiments.searchspace"),
    pkg("engine.hooks"),
    pkg("engine.loop.trainer"),
)
ConfigError = pkg("errors").ConfigError

FIXED = """
[fixed]
task.name = "toy_tasks.blobs"
data.verify_raw = false
run.figures = false
run.progress = "log"
"""


def space_file(project: Path, text: str) -> Path:
    path = project / "sweep.toml"
    path.write_text(text + FIXED, encoding="utf-8")
    return path


@pytest.fixture
def sbatch(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake sbatch on PATH: appends its arguments (one call a line) and prints job id 41."""
    tools = project / "bin"
    tools.mkdir()
    calls = project / "sbatch-calls.txt"
    script = tools / "sbatch"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho 41\n', encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return calls


GRID = """
[sweep]
name = "lr"
concurrency = 4
[space]
train.lr = [0.001, 0.003]
model.hidden = {range = [16, 48, 16]}
"""


def test_grid_expands_to_the_product_and_the_array_size(
    project: Path, sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = space_file(project, GRID)
    assert cli.main(["sweep", "--dry-run", str(path)]) == 0
    shown = capsys.readouterr().out
    listing = project / "runs" / ".sweeps" / "lr" / "runs.txt"
    assert not listing.exists() and not sbatch.exists()  # a dry run writes and submits nothing
    assert "--array=0-5%4" in shown
    assert cli.main(["sweep", str(path), "train.epochs=2"]) == 0
    lines = [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")]
    assert [ln.split()[-4:] for ln in lines] == [
        ["train.epochs=2", f"train.lr={lr}", f"model.hidden={hidden}", f"run.name=lr-00{i}"]
        for i, (lr, hidden) in enumerate(
            (lr, hidden) for lr in (0.001, 0.003) for hidden in (16, 32, 48)
        )
    ]
    assert all(ln.startswith("task.name=toy_tasks.blobs data.verify_raw=false") for ln in lines)
    (call,) = sbatch.read_text().splitlines()
    assert call.split() == [
        "--parsable",
        "--array=0-5%4",
        "--export=ALL,SWEEP_FILE=runs/.sweeps/lr/runs.txt",
        "slurm/sweep.sbatch",
    ]
    # Submitting again (a cancelled sweep) resubmits the same runs; another space is refused.
    assert cli.main(["sweep", str(path), "train.epochs=2"]) == 0
    assert cli.main(["sweep", str(path), "train.epochs=3"]) == 2
    assert "holds another run list" in capsys.readouterr().err


def test_a_failed_submission_leaves_no_run_list_so_a_corrected_one_goes_in(
    project: Path, sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = project / "bin" / "sbatch"
    working = script.read_text()
    script.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n")
    path = space_file(project, GRID)
    assert cli.main(["sweep", str(path)]) == 1
    assert "sbatch failed (exit 1): sbatch: error: invalid partition" in capsys.readouterr().err
    assert not (project / "runs" / ".sweeps" / "lr" / "runs.txt").exists()
    script.write_text(working)  # fixed; and the space changed too
    path.write_text(path.read_text().replace("[0.001, 0.003]", "[0.001, 0.01]"))
    assert cli.main(["sweep", str(path)]) == 0
    assert "0.01" in (project / "runs" / ".sweeps" / "lr" / "runs.txt").read_text()


def test_random_draws_are_seeded_and_within_their_distributions(project: Path) -> None:
    path = space_file(
        project,
        """
[sweep]
name = "rnd"
method = "random"
trials = 40
seed = 7
[space]
train.lr = {log_uniform = [1e-5, 1e-1]}
model.hidden = {int = [8, 12]}
model.dropout = {uniform = [0.0, 0.5]}
model.name = ["mlp", "cnn"]
""",
    )
    space = searchspace.load_space(path)
    drawn = searchspace.points(space)
    assert drawn == searchspace.points(space) and len(drawn) == 40
    assert all(1e-5 <= p["train.lr"] <= 1e-1 for p in drawn)
    assert {p["model.hidden"] for p in drawn} == {8, 9, 10, 11, 12}
    assert all(0 <= p["model.dropout"] <= 0.5 for p in drawn)
    assert {p["model.name"] for p in drawn} == {"mlp", "cnn"}
    # log-uniform: about as many draws below the geometric middle (1e-3) as above it
    assert 10 <= sum(p["train.lr"] < 1e-3 for p in drawn) <= 30


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            '[sweep]\nname = "a"\nalgorithm = "grid"\n[space]\ntrain.lr = [1]',
            "sweep.algorithm: unknown key",
        ),
        (
            '[sweep]\nname = "a"\n[space]\ntrain.lr = {uniform = [0.1, 1]}',
            "space.train.lr: uniform is a distribution",
        ),
        (
            '[sweep]\nname = "a"\n[space]\ntrain.lrr = [0.1]',
            "sweep run a-000: unknown config key 'train.lrr'",
        ),
        (
            '[sweep]\nname = "a"\n[space]\ntrain.lr = [0.1, 0]',
            "sweep run a-001: train.lr: must be > 0",
        ),
        (
            '[sweep]\nname = "a"\nmethod = "random"\n[space]\ntrain.lr = {log_uniform = [0, 1]}',
            "space.train.lr: log_uniform needs low > 0",
        ),
        (
            '[sweep]\nname = "a"\n[space]\nmodel.name = ["two words"]',
            "space.model.name: must be a number, true/false or a word",
        ),
        (
            '[sweep]\nname = "a"\nmetric = "acc"\n[space]\ntrain.lr = [1]',
            "sweep.metric: 'acc' is not a metric of task toy_tasks.blobs",
        ),
        (
            '[sweep]\nname = "../a"\n[space]\ntrain.lr = [1]',
            "sweep.name '../a': a run name is one folder",
        ),
        (
            '[sweep]\nname = "a"\n[space]\nmodel.hidden = {range = [16, 1e400, 16]}',
            "space.model.hidden: range = [start, stop, step] needs numbers",
        ),
        (
            '[sweep]\nname = "a"\nmethod = "random"\n[space]\ntrain.lr = {uniform = [nan, 1]}',
            "space.train.lr: uniform = [low, high] needs numbers with low < high",
        ),
        (
            '[sweep]\nname = "\xe9l\xe8ve"\n[space]\ntrain.lr = [1]',
            "sweep.toml: cannot be read: not UTF-8",
        ),
    ],
)
def test_a_bad_space_gets_one_line_naming_the_key(
    project: Path, capsys: pytest.CaptureFixture[str], space: str, message: str
) -> None:
    path = space_file(project, space)
    path.write_bytes(path.read_text().encode("latin-1"))  # UTF-8 where ASCII, else Latin-1
    assert cli.main(["sweep", "--dry-run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (project / "runs").exists()


class StopAtSecond:
    """A listener that asks the run to stop at its second validation."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.summaries: list[dict[str, Any]] = []

    def validated(self, step: int, metrics: dict[str, float]) -> bool:
        assert math.isfinite(metrics["loss"])
        self.steps.append(step)
        return len(self.steps) == 2

    def ended(self, summary: dict[str, Any]) -> None:
        self.summaries.append(dict(summary))


def test_a_listener_stops_a_run_cleanly_as_pruned(project: Path) -> None:
    cfg = pkg("task").load_config(
        None,
        [
            "task.name=toy_tasks.blobs",
            "data.verify_raw=false",
            "run.figures=false",
            "run.progress=log",
            "run.val_every_steps=3",
            "run.name=p",
        ],
    )
    listener = StopAtSecond()
    with hooks.listening(listener):
        result = trainer.train(cfg)
    assert result.exit_code == 0  # not a requeue: the sweep goes on with other runs
    assert listener.steps == [3, 6]
    assert [s["status"] for s in listener.summaries] == ["pruned"]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "pruned" and summary["step"] == 6 < summary["total_steps"]
    assert (
        pkg("engine.state.checkpoint").load_latest(result.run_dir / "checkpoints")["position"][
            "step"
        ]
        == 6
    )


STUDY = """
[sweep]
name = "opt"
method = "optuna"
trials = 3
concurrency = 1
prune_after = 1
[space]
train.lr = {log_uniform = [1e-7, 1e-1]}
[[enqueue]]
train.lr = 0.01
[[enqueue]]
train.lr = 1e-7
[[enqueue]]
train.lr = 0.01
"""


def test_an_optuna_study_prunes_resumes_a_requeued_trial_and_continues(
    project: Path, sbatch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("optuna", reason="the sweep extra (optuna) is not installed")
    path = space_file(project, STUDY)
    extra = ["run.val_every_steps=4", "train.epochs=10"]
    assert cli.main(["sweep", str(path), *extra]) == 0
    copy = project / "runs" / ".sweeps" / "opt" / "sweep.toml"
    (call,) = sbatch.read_text().splitlines()
    assert call.split()[1:3] == [
        "--array=0-2%1",
        "--export=ALL,SWEEP_SPACE=runs/.sweeps/opt/sweep.toml",
    ]
    assert call.split()[-2:] == extra  # the job script passes them to every trial

    def task(job: str, index: int, *more: str) -> int:
        monkeypatch.setenv("SLURM_ARRAY_JOB_ID", job)
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(index))
        return cli.main(["sweep", "--trial", str(copy), *extra, *more])

    assert task("41", 0) == 0
    assert task("41", 1) == 0  # lr 1e-7 learns nothing: pruned at its first validation
    segment = "run.max_steps_this_segment=5"  # the job's time is up after 5 steps: requeued
    assert task("41", 2, segment) == 0
    assert task("41", 2, segment) == 0  # the requeued task: its own trial and run, resumed
    settings = pkg("settings").get_settings()
    study = pkg("experiments.sweep").open_study(searchspace.load_space(copy), settings)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "RUNNING"]
    assert study.trials[2].user_attrs["slurm_task"] == "41_2"
    # The sweep is cancelled and submitted again: one trial is left, the running one.
    assert cli.main(["sweep", str(path), *extra]) == 0
    assert sbatch.read_text().splitlines()[-1].split()[1] == "--array=0-0%1"
    assert task("42", 0) == 0
    trials = pkg("experiments.sweep").open_study(searchspace.load_space(copy), settings).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "COMPLETE"]
    assert trials[1].intermediate_values.keys() == {3}  # the first validation (an epoch end)
    # Trial 2 (three segments) reported what the identical trial 0 did: exact resume.
    assert trials[2].intermediate_values == trials[0].intermediate_values
    summary = json.loads((project / "runs" / "opt-002" / "summary.json").read_text())
    assert trials[2].value == trials[0].value == summary["val_loss"]
    # Every trial finished: a further task has nothing to do, a new submission neither.
    assert task("42", 1) == 0
    assert (
        len(pkg("experiments.sweep").open_study(searchspace.load_space(copy), settings).trials) == 3
    )
    calls = len(sbatch.read_text().splitlines())
    assert cli.main(["sweep", str(path), *extra]) == 0
    assert len(sbatch.read_text().splitlines()) == calls
    # More trials continue the same study; another space under the same name is refused.
    path.write_text(path.read_text().replace("trials = 3", "trials = 4"))
    assert cli.main(["sweep", str(path), *extra]) == 0
    assert sbatch.read_text().splitlines()[-1].split()[1] == "--array=0-0%1"
    path.write_text(path.read_text().replace("1e-7, 1e-1", "1e-6, 1e-1"))
    assert cli.main(["sweep", str(path), *extra]) == 2


def test_a_damaged_journal_is_refused_with_its_repair_and_nothing_is_written(
    project: Path, sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna", reason="the sweep extra (optuna) is not installed")
    path = space_file(project, STUDY)
    assert cli.main(["sweep", str(path)]) == 0  # the study and its three enqueued trials
    journal = project / "runs" / ".sweeps" / "opt" / "optuna.journal"
    whole, calls = journal.read_bytes(), sbatch.read_text()
    journal.write_bytes(whole[:-5])  # the last record cut off, as by a kill while writing
    capsys.readouterr()
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{journal}: its last record is cut off" in err and len(err.splitlines()) == 1
    assert (journal.read_bytes(), sbatch.read_text()) == (whole[:-5], calls)  # left as it was
    os.truncate(journal, int(err.split("truncate -s ")[1].split()[0]))  # the repair it names
    assert cli.main(["sweep", str(path)]) == 0
    study = pkg("experiments.sweep").open_study(
        searchspace.load_space(path), pkg("settings").get_settings()
    )
    assert len(study.trials) == 2  # the cut record (the third enqueued trial) is gone
    for damage in (b"garbage\n", b"\xff\xfe\n", b'{"op": 1}\n'):
        journal.write_bytes(damage + whole)
        capsys.readouterr()
        assert cli.main(["sweep", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{journal}:1: not an Optuna journal record" in err and len(err.splitlines()) == 1
