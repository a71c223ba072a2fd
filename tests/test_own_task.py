"""A user's own research in a fresh bake: their data in data/raw, their task module and config.

The task below is written here, not shipped: it reads sensor readings from a CSV file and
regresses a float target. Like research code written in a hurry, its methods have no
docstrings: the project's lint asks none of a task module, so it passes the commit hook.
Nothing but its module and its config file is added to the project (and the user's data with
its manifest); the loop, the scripts and the project's own tests stay as generated, and the
project's suite must stay green.

The bake is the one farthest from the default (apptainer, the generic preset), and its quick
suite runs with every extra absent: one run of the suite covers three claims. Environment and
preset change the job scripts, configs and Makefile the suite reads; the Python package is
the same for every choice, so the default bake's whole suite (test_generated_suite.py, every
extra installed, the digits example in place) covers the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git
from engines import bake
from envcases import CASES, HANG_S, extras_modules, project_pytest

SENSOR_TASK = '''"""Sensor readings (three channels) -> the temperature an hour later."""

import csv
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..api import DataError, Datasets, Regression, split_indices


@dataclass
class Options:
    file: str = "readings.csv"


class Sensor(Regression):
    Options = Options

    def prepare(self, out_dir: Path) -> str:
        path = self.settings.raw_dir / self.options.file
        if not path.is_file():
            raise DataError(f"{path} not found")
        with path.open(newline="") as f:
            rows = [[float(v) for v in row] for row in csv.reader(f)]
        table = torch.tensor(rows)
        x, y = table[:, :3], table[:, 3:]
        parts = split_indices(len(table), 0.2, 0.2, seed=1)
        mean, std = y[parts["train"]].mean(0), y[parts["train"]].std(0)
        payload = {k: {"x": x[i], "y": (y[i] - mean) / std} for k, i in parts.items()}
        torch.save(payload, out_dir / "sensor.pt")
        return f"task {self.name}: {len(table)} readings"

    def datasets(self, data_dir: Path) -> Datasets:
        data = torch.load(data_dir / "sensor.pt", weights_only=True)
        return Datasets(**{k: TensorDataset(v["x"], v["y"]) for k, v in data.items()})

    def build_model(self) -> nn.Module:
        width = self.cfg.model.hidden
        return nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1))


TASK = Sensor
'''

SENSOR_CONFIG = """# The sensor task.
[task]
file = "readings.csv"

[model]
hidden = 16

[train]
epochs = 20
batch_size = 32
lr = 0.01
"""


def readings(n: int = 400) -> str:
    """Deterministic readings with a smooth float target (the user's own data)."""
    lines = []
    for i in range(n):
        a, b, c = (i % 17) / 17, (i % 11) / 11, (i % 7) / 7
        lines.append(f"{a:.4f},{b:.4f},{c:.4f},{20 + 5 * a - 3 * b * c + 0.5 * b:.4f}")
    return "\n".join(lines) + "\n"


def run(cmd: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=project, env=env, capture_output=True, text=True, check=False, timeout=HANG_S
    )


@pytest.mark.slow
def test_own_task_and_data_in_a_fresh_bake_whose_suite_needs_no_extra(
    template: Path, tmp_path: Path
) -> None:
    answers = CASES["apptainer-generic"] | {"project_name": "Heat", "git_init": "yes"}
    baked = bake("cookiecutter", template, tmp_path, answers | {"project_slug": "heat"})
    assert baked.ok, baked.stderr
    project = baked.project
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "heat"]

    # The user's data replaces the example's: writable again, swapped, frozen anew.
    raw = project / "data" / "raw"
    example = raw / "digits.csv.gz"
    example.chmod(example.stat().st_mode | stat.S_IWUSR)
    example.unlink()
    (raw / "readings.csv").write_text(readings(), encoding="utf-8")
    done = run([*cli, "data", "freeze", "--update"], project, env)
    assert done.returncode == 0, done.stderr

    # Their task: one module, one config file; picked by the config key on the command line.
    (project / "src" / "heat" / "tasks" / "sensor.py").write_text(SENSOR_TASK, encoding="utf-8")
    (project / "configs" / "tasks" / "sensor.toml").write_text(SENSOR_CONFIG, encoding="utf-8")
    lint = [sys.executable, "-m", "ruff"]
    for check in (["check"], ["format", "--check"]):
        done = run([*lint, *check, "src/heat/tasks/sensor.py"], project, env)
        assert done.returncode == 0, done.stdout + done.stderr
    commands = [
        ["prepare", "task.name=sensor"],
        ["train", "task.name=sensor", "run.name=own"],
        ["evaluate", "--run", "own"],  # the run's saved config names its task
    ]
    for command in commands:
        done = run([*cli, *command], project, env)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert '"r2"' in done.stdout
    figures = project / "reports" / "figures" / "own"
    assert (figures / "true_vs_predicted_test.png").is_file()

    # Only the user's files changed: their task, its config, their data and its manifest.
    changed = {line[3:] for line in git(project, "status", "--porcelain", "-uall").splitlines()}
    assert changed == {
        "data/raw.manifest.tsv",
        "data/raw/digits.csv.gz",  # the example's file, removed (readings.csv is ignored)
        "src/heat/tasks/sensor.py",
        "configs/tasks/sensor.toml",
    }

    # The project's own suite stays green: the example's checks step aside, and the new task
    # is checked against the contract on the user's real (prepared) data. The quick set, as
    # `make test` runs it: the slow, multi-process tests run on the default bake
    # (test_generated_suite.py) and do not depend on the user's task. Every extra is absent
    # but the one its answers chose (tensorboard, which `make install` installs), as after a
    # plain `pip install -e .[tensorboard]`: what needs one skips, naming it, and nothing fails.
    absent = extras_modules(project) - {answers["tracking"]}
    assert {"transformers", "datasets", "optuna", "torchmetrics", "mlflow"} <= absent
    out = project_pytest(project, "-rs", "-m", "not slow", "-p", "no:xdist", absent=absent)
    assert " passed" in out.splitlines()[-1]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    named = {extra for line in skipped for extra in re.findall(r"the (\w+) extra", line)}
    assert "hf" in named and len(named) >= 3, skipped  # each skip names what to install
    assert any("the digits example is not part of this project" in line for line in skipped)
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = run([*pytest, "tests/test_task_contract.py", "-k", "sensor"], project, env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.splitlines()[-1].startswith("3 passed")

    # Without its processed data the contract test prepares the task itself; without its
    # raw data too, it fails (never skips) with the command that makes the data.
    shutil.rmtree(project / "data" / "processed" / "sensor")
    done = run([*pytest, "tests/test_task_contract.py", "-k", "sensor"], project, env)
    assert done.returncode == 0, done.stdout[-3000:]
    (project / "data" / "raw" / "readings.csv").unlink()
    done = run([*pytest, "tests/test_task_contract.py", "-k", "sensor"], project, env)
    assert done.returncode == 1 and "3 errors" in done.stdout.splitlines()[-1], done.stdout
    raw = project / "data" / "raw"
    assert (
        f"task sensor: no processed data, and its prepare cannot make it from {raw}: "
        f"{raw / 'readings.csv'} not found" in done.stdout
    )
    assert "then run `prepare task.name=sensor`" in done.stdout
