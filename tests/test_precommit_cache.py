"""A course's shared pre-commit cache: warmed once, then every participant's first commit uses it.

The generated hooks are `repo: local` hooks with `language: python`: pre-commit builds one
environment per set of pinned dependencies in its cache ($PRE_COMMIT_HOME) and records each
in the cache's sqlite database (table `repos`). The recipe of the tutorial's "For
instructors" part: the instructor runs `pre-commit install-hooks` in one bake with the shared
PRE_COMMIT_HOME, then makes the cache readable and not writable for the group; participants
export the same PRE_COMMIT_HOME. Their first commit then builds no environment and writes
nothing into the cache (pre-commit skips its bookkeeping in a cache it may not write).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from engines import BIN, bake
from envcases import run

# pre-commit reads PRE_COMMIT_HOME itself; the hooks need nothing from the test's own Python.
CLEAN_ENV: dict[str, str | None] = {"PYTHONPATH": None, "VIRTUAL_ENV": None}
IDENTITY = ["-c", "user.name=Ada Lovelace", "-c", "user.email=ada@example.org"]


def environments(cache: Path) -> list[tuple[str, str]]:
    """(dependencies, folder) of every hook environment the cache's database records."""
    with sqlite3.connect(f"file:{cache / 'db.db'}?mode=ro", uri=True) as db:
        return sorted(db.execute("SELECT repo, path FROM repos").fetchall())


def state(cache: Path) -> dict[str, tuple[int, int, int]]:
    """Mode, size and modification time of everything in the cache, by relative path."""
    found = {}
    for path in [cache, *cache.rglob("*")]:
        info = path.lstat()
        found[path.relative_to(cache).as_posix()] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def dependency_sets(project: Path) -> set[tuple[str, ...]]:
    """The distinct `additional_dependencies` of the project's python hooks."""
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text("utf-8"))
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    return {tuple(h.get("additional_dependencies", [])) for h in hooks if h["language"] == "python"}


def participant() -> list[str]:
    """A command prefix under which the cache's permission bits bind this process.

    A participant is not the cache's owner and may not write it. The test stands in for one
    on a cache without write bits; as root it also drops the capability that lets root
    write regardless of them.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("as root, a read-only cache needs setpriv (util-linux) to bind root")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.slow
def test_a_warmed_shared_cache_serves_another_projects_first_commit(
    template: Path, tmp_path: Path
) -> None:
    prefix = participant()
    cache = tmp_path / "course" / "pre-commit"
    env = {**CLEAN_ENV, "PRE_COMMIT_HOME": str(cache)}
    # The instructor's bake and a participant's, with another name: another package, the
    # same pinned hook dependencies.
    instructor = bake("cookiecutter", template, tmp_path / "instructor", {})
    own = bake("cookiecutter", template, tmp_path / "ada", {"project_name": "Ada Digits"})
    assert instructor.ok, instructor.stderr
    assert own.ok, own.stderr

    warm = run([str(BIN / "pre-commit"), "install-hooks"], instructor.project, env)
    assert warm.returncode == 0, warm.stdout[-3000:] + warm.stderr[-3000:]
    built = environments(cache)
    assert len(built) == len(dependency_sets(instructor.project)) == len(list(cache.glob("repo*")))
    # The recipe: the group may read and enter, nobody but the owner may write. pre-commit
    # makes each environment's folder 0700 and its database 0600, whatever the umask.
    done = run(["chmod", "-R", "g+rX,go-w", str(cache)], tmp_path)
    assert done.returncode == 0, done.stderr
    modes = [mode for mode, _, _ in state(cache).values()]
    assert all(mode & 0o040 for mode in modes), "something the group cannot read"
    assert all(mode & 0o010 for mode in modes if mode & 0o100), "something the group cannot run"
    # The participant owns none of it: without the owner's write bit the test process sees
    # the cache as a participant does.
    done = run(["chmod", "-R", "u-w", str(cache)], tmp_path)
    assert done.returncode == 0, done.stderr
    before = state(cache)

    project = own.project
    hooks = run([*prefix, str(BIN / "pre-commit"), "install"], project, env)
    assert hooks.returncode == 0, hooks.stdout + hooks.stderr
    task = project / "configs" / "tasks" / "digits.toml"
    task.write_text(task.read_text("utf-8").replace("epochs = 30", "epochs = 20"), "utf-8")
    commit = run([*prefix, "git", *IDENTITY, "commit", "-am", "Digits: 20 epochs"], project, env)
    try:
        output = commit.stdout + commit.stderr
        assert commit.returncode == 0, output
        assert "TOML parses" in output
        assert "raw data changes only with" in output
        assert "Initializing environment" not in output, output
        assert "Installing environment" not in output, output
        assert environments(cache) == built
        assert state(cache) == before, "the participant's commit wrote into the shared cache"
    finally:
        run(["chmod", "-R", "u+w", str(cache)], tmp_path)  # so the test's folder can be removed
