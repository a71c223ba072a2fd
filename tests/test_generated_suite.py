"""The default project's own test suite passes, run the way its users run it."""

from __future__ import annotations

import shutil
from pathlib import Path

from engines import Bake
from envcases import project_pytest


def test_default_project_suite_passes(default_bake: Bake) -> None:
    out = project_pytest(default_bake.project)
    assert " passed" in out.splitlines()[-1]


def test_data_a_user_prepared_never_fails_the_suite(default_bake: Bake, tmp_path: Path) -> None:
    """`prepare task.name=hub_lm model.init_from=models/X`, as the fine-tune page shows, leaves
    data/processed/hub_lm; the model folder was given on the command line, which the tests
    cannot know: the contract tests skip hub_lm naming the setting, they do not fail."""
    project = tmp_path / "project"
    shutil.copytree(default_bake.project, project, symlinks=True)
    prepared = project / "data" / "processed" / "hub_lm"
    prepared.mkdir(parents=True)
    (prepared / "train.index.pt").write_bytes(b"")
    out = project_pytest(project, "-rs", "tests/test_task_contract.py", "-k", "hub_lm")
    assert "task hub_lm: model.init_from: task hub_lm needs a model folder" in out
