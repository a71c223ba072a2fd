"""Raw-data guard in generated projects: shipped manifest, git rules, first freeze/verify.

The guard's behaviour itself is tested by the generated project's own
`tests/test_rawdata*.py` (run by test_generated_suite.py); these tests check what only the
template can get wrong.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engines import Bake, bake

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "{{cookiecutter.project_slug}}"
EXAMPLE = "{% if cookiecutter.example == 'yes' %}"
SHIPPED = ("corpus.txt", "digits.csv.gz")  # the examples' raw files
SHIPPED_MANIFEST = PROJECT / "data" / f"{EXAMPLE}raw.manifest.tsv{{% endif %}}"


def test_shipped_manifest_records_the_shipped_example_files() -> None:
    lines = SHIPPED_MANIFEST.read_text(encoding="utf-8").splitlines()
    expected = ["path\tsize\tmode\tsha256"]
    for name in SHIPPED:
        data = (PROJECT / "data" / "raw" / f"{EXAMPLE}{name}{{% endif %}}").read_bytes()
        expected.append(f"{name}\t{len(data)}\t0444\t{hashlib.sha256(data).hexdigest()}")
    assert lines == expected


def test_generated_gitignore_hides_no_template_file() -> None:
    """The project's .gitignore also applies inside the template repository.

    There its data rules would hide the conditionally named example file from anything
    that builds a fresh index (copier's dirty-template copy, `git add -A` in a new clone).
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", PROJECT.name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin", "-z"],
        cwd=ROOT,
        input="\0".join(filter(None, listed)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.split("\0") == [""]


def ignored(project: Path, *paths: str) -> set[str]:
    """The subset of ``paths`` that git ignores in ``project``."""
    if not (project / ".git").exists():
        subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    command = ["git", "check-ignore", "--no-index", *paths]
    done = subprocess.run(command, cwd=project, capture_output=True, text=True, check=False)
    return set(done.stdout.split())


DATA_PATHS = (
    "data/raw/survey.csv",
    "data/raw/batch1/img.png",
    "data/interim/x.parquet",
    "data/processed/digits/splits.pt",
    "data/external/lexicon.txt",
    "data/.raw-cache.json",
    "data/processed/.digits.sha256-cache.json",
    "weights/backbone.pt",
    "data/raw.manifest.tsv",
    "data/README.md",
    "data/raw/.gitkeep",
    "data/processed/.gitkeep",
    "data/raw/digits.csv.gz",
    "data/raw/corpus.txt",
)
KEPT = {"data/raw.manifest.tsv", "data/README.md", "data/raw/.gitkeep", "data/processed/.gitkeep"}


@pytest.mark.parametrize("example", ["yes", "no"])
def test_gitignore_keeps_data_out_but_manifest_and_readmes_in(
    example: str, template: Path, tmp_path: Path
) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"example": example, "git_init": "no"})
    assert baked.ok, baked.stderr
    kept = KEPT | ({f"data/raw/{name}" for name in SHIPPED} if example == "yes" else set())
    assert ignored(baked.project, *DATA_PATHS) == set(DATA_PATHS) - kept
    assert (baked.project / "data" / "raw.manifest.tsv").exists() == (example == "yes")
    assert (baked.project / "data" / "README.md").is_file()


def data_command(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PROJECT_ROOT": str(project)}
    env.pop("DATA_DIR", None)
    command = [sys.executable, "-m", project.name, "data", *args]
    return subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, check=False
    )


def test_fresh_project_freezes_and_verifies_its_example(default_bake: Bake, tmp_path: Path) -> None:
    project = tmp_path / default_bake.project.name
    shutil.copytree(default_bake.project, project, symlinks=True)
    if (project / ".git").exists():  # git_init=yes: data and manifest are in the first commit
        listed = subprocess.run(
            ["git", "ls-files", "data"], cwd=project, capture_output=True, text=True, check=True
        ).stdout.split()
        assert {"data/raw/digits.csv.gz", "data/raw/corpus.txt", "data/raw.manifest.tsv"} <= set(
            listed
        )
    # The post-generation step gave the example the manifest's read-only mode.
    assert data_command(project, "verify").returncode == 0
    # A git clone writes files writable again: verify says so ...
    (project / "data" / "raw" / "digits.csv.gz").chmod(0o644)
    first = data_command(project, "verify")
    assert first.returncode == 1
    assert first.stdout.startswith("permissions data/raw/digits.csv.gz (mode 0644")
    freeze = data_command(project, "freeze")  # ... until the first freeze
    assert freeze.returncode == 0, freeze.stderr
    assert data_command(project, "verify", "--full").returncode == 0
    assert (project / "data" / "raw.manifest.tsv").read_bytes() == SHIPPED_MANIFEST.read_bytes()
