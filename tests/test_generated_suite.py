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
# pytest in a child where modules may be absent as if never installed: a None in sys.modules
# makes `import` fail with ModuleNotFoundError and `importlib.util.find_spec` return None.
ABSENT = """
import sys
sys.modules.update(dict.fromkeys({absent!r}))
sys.exit(__import__("pytest").main(sys.argv[1:]))
"""


def project_pytest(project: Path, *args: str, absent: set[str] | None = None) -> str:
    """The project's own pytest run with `args` (the `absent` modules missing); its output.

    The project is not installed into this environment: `src` on the path stands in for
    `pip install -e .`, which would only add the same files.
    """
    code = ABSENT.format(absent=sorted(absent or ()))
    done = subprocess.run(
        [sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(project / "src")},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


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
    absent = extras_modules(default_bake.project)
    assert {"transformers", "datasets", "optuna", "torchmetrics", "mlflow"} <= absent
    args = ("-rs", "-m", "not slow", "-p", "no:xdist")
    out = project_pytest(default_bake.project, *args, absent=absent)
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    named = {extra for line in skipped for extra in re.findall(r"the (\w+) extra", line)}
    assert "hf" in named and len(named) >= 3, skipped  # each skip names what to install
