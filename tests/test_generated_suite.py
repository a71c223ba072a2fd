"""The default project's own test suite passes, run the way its users run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from engines import Bake
from packaging.requirements import Requirement

# The module an extra's distribution is imported as, where the two differ.
IMPORT_NAMES = {"mlflow-skinny": "mlflow"}
# pytest in a child where modules are absent as if never installed: a None in sys.modules
# makes `import` fail with ModuleNotFoundError and `importlib.util.find_spec` return None.
ABSENT = """
import sys
sys.modules.update(dict.fromkeys({absent!r}))
sys.exit(__import__("pytest").main(sys.argv[1:]))
"""


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


def extras_modules(project: Path) -> set[str]:
    """The modules of every optional extra of the project's pyproject.toml."""
    pyproject = tomllib.loads((project / "pyproject.toml").read_text("utf-8"))
    names = {
        Requirement(line).name
        for lines in pyproject["project"]["optional-dependencies"].values()
        for line in lines
    }
    names.discard("torch")  # uv's torch-build extras name torch itself: never absent
    return {IMPORT_NAMES.get(name, name) for name in names}


def test_default_project_quick_suite_passes_without_any_extra(default_bake: Bake) -> None:
    """`pip install -e .` alone: what needs an extra skips, naming it, and nothing fails.

    The full suite above runs with every extra installed (this environment has them all).
    """
    project = default_bake.project
    absent = extras_modules(project)
    assert {"transformers", "datasets", "optuna", "torchmetrics", "mlflow"} <= absent
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    args = ["-q", "-rs", "-m", "not slow", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = subprocess.run(
        [sys.executable, "-c", ABSENT.format(absent=sorted(absent)), *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    named = {extra for line in skipped for extra in re.findall(r"the (\w+) extra", line)}
    assert "hf" in named and len(named) >= 3, skipped  # each skip names what to install
