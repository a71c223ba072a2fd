"""The generated snakemake workflow: real snakemake plans it and runs it, here and on Slurm.

On the cluster the train step is slurm/train.sbatch submitted with `sbatch --wait`: these
tests run it on a real local Slurm, including a stop signal and requeue in the middle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import bake
from slurm.localslurm import LocalSlurm, temporary_cluster
from slurm.project import DEADLINE, JobProject, make_venv, require_slurm, resumed_step

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("snakemake") is None,
    reason="snakemake missing (see requirements-test.txt)",
)


def snakemake_env(project: Path, **extra: str) -> dict[str, str]:
    """The project's venv first on PATH; no Slurm job variables of an outer job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PATH=f"{project / '.venv' / 'bin'}:{env['PATH']}", OMP_NUM_THREADS="1")
    env["PYTHONWARNINGS"] = "ignore"
    return {**env, **extra}


def snakemake_argv(project: Path, *args: str) -> list[str]:
    return [str(project / ".venv" / "bin" / "python"), "-m", "snakemake", *args]


def snakemake(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m snakemake ARGS` in the project with its venv active (PATH first)."""
    return subprocess.run(
        snakemake_argv(project, *args),
        cwd=project,
        env=snakemake_env(project, **env),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


@pytest.fixture(scope="module")
def project(template: Path, tmp_path_factory) -> Path:
    baked = bake("cookiecutter", template, tmp_path_factory.mktemp("snake"), {"snakemake": "yes"})
    assert baked.ok, baked.stderr
    make_venv(baked.project)
    return baked.project


def plan(output: str) -> dict[str, int]:
    """Job counts of a dry run's 'Job stats' table."""
    table = output.split("Job stats:")[1].split("total", maxsplit=1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def test_dry_run_plans_prepare_train_evaluate(project: Path) -> None:
    res = snakemake(project, "-n")
    assert res.returncode == 0, res.stderr + res.stdout
    assert plan(res.stdout) == {"prepare": 1, "train": 1, "evaluate": 1, "all": 1}


def test_no_workflow_files_without_snakemake(template: Path, tmp_path: Path) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"snakemake": "no"})
    assert baked.ok, baked.stderr
    assert [p for p in (baked.project / "workflow").rglob("*") if p.is_file()] == []
    assert ".snakemake" not in (baked.project / ".gitignore").read_text()


def test_local_run_produces_the_outputs(project: Path) -> None:
    runs = json.dumps({"main": "train.epochs=2 run.figures=false"})
    res = snakemake(project, "--cores", "2", "--config", f"runs={runs}", "submit=false")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (project / "data/processed/digits/SHA256SUMS").is_file()
    summary = json.loads((project / "runs/main/summary.json").read_text())
    assert summary["status"] == "finished"
    evaluation = json.loads((project / "runs/main/evaluation.json").read_text())
    assert evaluation["run"] == "main" and evaluation["samples"] > 0
    again = snakemake(project, "-n", "--config", f"runs={runs}", "submit=false")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    require_slurm()
    with temporary_cluster("slurm-snake-") as instance:
        yield instance


@pytest.mark.slurm
def test_train_step_is_a_slurm_job_that_requeues_until_done(
    project: Path, cluster: LocalSlurm
) -> None:
    # Training on the cluster: `sbatch --wait slurm/train.sbatch`. A stop signal midway makes
    # the job checkpoint and requeue itself; snakemake waits through it (no retry count
    # caps the segments) and evaluates the finished run.
    proj = JobProject(project, cluster)
    runs = json.dumps({"viaslurm": "train.epochs=20 run.figures=false"})
    env = snakemake_env(project, **{**proj.env(), "PROBE_STEP_DELAY": "0.5"})
    env["PATH"] = f"{project / '.venv' / 'bin'}:{env['PATH']}"
    with subprocess.Popen(
        snakemake_argv(project, "--cores", "2", "--config", f"runs={runs}"),
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as run:
        proj.wait_for("a checkpoint", lambda: proj.checkpoints("viaslurm"), None)  # id unknown yet
        (log,) = (project / "logs").glob(f"{proj.slug}-*.out")
        job = log.stem.rsplit("-", 1)[1]
        cluster.run("scancel", "--signal=USR1", "--batch", job)
        output, _ = run.communicate(timeout=DEADLINE)
    assert run.returncode == 0, output[-3000:]
    info = proj.finished(job)
    text = log.read_text()
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), text
    assert f"requeueing {job}" in text and 0 < resumed_step(text) < 220
    summary = json.loads((project / "runs/viaslurm/summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("finished", 220)
    assert json.loads((project / "runs/viaslurm/evaluation.json").read_text())["run"] == "viaslurm"
