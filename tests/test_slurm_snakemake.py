"""The generated snakemake workflow: real snakemake plans it, runs it locally, reads the profile.

The Slurm profile is checked by snakemake itself with the Slurm executor plugin loaded (a dry
run prints each rule's resources); submitting through the plugin is not part of these tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from engines import bake
from slurm.project import make_venv

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("snakemake") is None
    or importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
    reason="snakemake + snakemake-executor-plugin-slurm missing (see requirements-test.txt)",
)


def snakemake(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m snakemake ARGS` in the project with its venv active (PATH first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PATH=f"{project / '.venv' / 'bin'}:{env['PATH']}", OMP_NUM_THREADS="1")
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-m", "snakemake", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
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


def test_slurm_profile_gives_train_the_preset_resources(project: Path) -> None:
    profile = yaml.safe_load((project / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    res = snakemake(project, "-n", "--workflow-profile", "workflow/profiles/slurm")
    assert res.returncode == 0, res.stderr + res.stdout
    train = res.stdout.split("rule train:")[1].split("\n\n")[0]
    resources = dict(re.findall(r"(\w+)=([^,\s]+)", train.split("resources:")[1]))
    # Default answers + grete preset: 12:00:00, 64G, 8 CPUs per GPU, one A100 on grete:shared.
    assert resources["slurm_partition"] == "grete:shared"
    assert resources["runtime"] == "720"
    assert resources["mem_mb"] == "65536"
    assert resources["cpus_per_task"] == "8"
    assert (resources["gpu"], resources["gpu_model"]) == ("1", "A100")


def test_profile_converts_other_answers(template: Path, tmp_path: Path) -> None:
    answers = {
        "snakemake": "yes",
        "cluster": "generic",
        "time_limit": "1-00:30",
        "memory": "1500M",
        "account": "proj01",
    }
    baked = bake("cookiecutter", template, tmp_path, answers)
    assert baked.ok, baked.stderr
    profile = yaml.safe_load((baked.project / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["default-resources"]["slurm_account"] == "proj01"
    assert "slurm-no-account" not in profile
    train = profile["set-resources"]["train"]
    assert (train["runtime"], train["mem_mb"], train["gpu"]) == (1470, 1500, 1)
    assert "gpu_model" not in train  # the generic preset has no GPU type


def test_no_workflow_files_without_snakemake(template: Path, tmp_path: Path) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"snakemake": "no"})
    assert baked.ok, baked.stderr
    assert [p for p in (baked.project / "workflow").rglob("*") if p.is_file()] == []
    assert ".snakemake" not in (baked.project / ".gitignore").read_text()


def test_local_run_produces_the_outputs(project: Path) -> None:
    runs = json.dumps({"main": "train.epochs=2 run.figures=false"})
    res = snakemake(project, "--cores", "2", "--config", f"runs={runs}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (project / "data/processed/digits/SHA256SUMS").is_file()
    summary = json.loads((project / "runs/main/summary.json").read_text())
    assert summary["status"] == "finished"
    evaluation = json.loads((project / "runs/main/evaluation.json").read_text())
    assert evaluation["run"] == "main" and evaluation["samples"] > 0
    again = snakemake(project, "-n", "--config", f"runs={runs}")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
