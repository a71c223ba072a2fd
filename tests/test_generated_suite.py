"""The default project's own test suite passes, run the way its users run it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from engines import Bake


def test_default_project_suite_passes(default_bake: Bake) -> None:
    project = default_bake.project
    # The project is not installed into this environment: `src` on the path stands in for
    # `pip install -e .`, which would only add the same files.
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]


def test_data_a_user_prepared_never_fails_the_suite(default_bake: Bake, tmp_path: Path) -> None:
    """`prepare task.name=hub_lm model.init_from=models/X`, as the fine-tune page shows, leaves
    data/processed/hub_lm; the model folder was given on the command line, which the tests
    cannot know: the contract tests skip hub_lm naming the setting, they do not fail."""
    project = tmp_path / "project"
    shutil.copytree(default_bake.project, project, symlinks=True)
    prepared = project / "data" / "processed" / "hub_lm"
    prepared.mkdir(parents=True)
    (prepared / "train.index.pt").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/test_task_contract.py", "-k", "hub_lm"],
        cwd=project, capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "task hub_lm: model.init_from: task hub_lm needs a model folder" in done.stdout
