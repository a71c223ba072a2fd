"""Shared fixtures: a clean, committed snapshot of the template to generate from."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from engines import Bake, bake

ROOT = Path(__file__).resolve().parent.parent
# The working tree stands for the release it declares (the template version, one source).
RELEASE = "v" + json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["_template_version"]
# The two files that take longest, run first, one on each worker: `make test-all` hands its
# two workers files in the order collected (--dist loadfile --no-loadscope-reorder; two each
# to start, then one as a worker runs dry). Ordered by their number of tests (xdist's
# default), the generated project's own suite (two tests, 11 minutes of one core) started
# late and left the other core idle for most of that time at the end.
LONGEST_FIRST = ("test_generated_suite.py", "test_own_task.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collected order, but the files of LONGEST_FIRST first (in that order)."""
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))


def git(cwd: Path, *args: str) -> str:
    """Run git with a fixed identity; return stdout, fail the test on error."""
    done = subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.org", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def snapshot_template(dest: Path, tag: str | None = RELEASE) -> Path:
    """Copy the template's source files (tracked or new, never ignored) into a fresh repo.

    copier and cruft read a template from git, so the tests give them a repository that
    holds exactly the working tree, tagged like a release (no tag with ``tag=None``).
    """
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    git(dest, "init", "-q", "-b", "main")
    # -f: the generated project's own .gitignore (e.g. data/raw) must not hide template files.
    git(dest, "add", "-A", "-f")
    git(dest, "commit", "-q", "-m", "template snapshot")
    # One pack instead of a file per object: cookiecutter copies the whole template folder,
    # .git included, for its pre-prompt hook on every bake (half the files, measured).
    git(dest, "repack", "-adq")
    git(dest, "prune-packed", "-q")
    if tag:
        git(dest, "tag", tag)
    return dest


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template as a tagged git repository."""
    return snapshot_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="session")
def default_bake(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Bake:
    """The default project, generated once by cookiecutter."""
    baked = bake("cookiecutter", template, tmp_path_factory.mktemp("default"), {})
    assert baked.ok, baked.stderr
    return baked
