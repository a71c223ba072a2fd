"""Values passed to make (ARGS=, TEMPLATE=, REF=, ...) are text, never shell code to run.

A recipe that pastes `$(ARGS)` into its command line hands `$(...)` and backticks in the value
to the shell, which runs them. Both Makefiles export the values instead and read them as
`$$VAR`. Checked twice: no recipe line of either Makefile pastes an exported value, and each
target that takes one is run with a value that would create a file if the shell ran it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engines import ROOT, make_value

if TYPE_CHECKING:
    from engines import Bake

EXPORT = re.compile(r"^export ((?:[A-Z_]+ ?)+)$", re.M)


def exported(makefile: str) -> set[str]:
    """The variables a Makefile exports."""
    return {name for line in EXPORT.findall(makefile) for name in line.split()}


def pasted(makefile: str) -> list[str]:
    """Recipe lines that paste an exported variable (`$(VAR)` outside an `$(if $(VAR),` test)."""
    names = exported(makefile)
    assert names, "the Makefile exports no user values"
    found = []
    for line in makefile.splitlines():
        if not line.startswith("\t"):
            continue
        bare = re.sub(r"\$\(if \$\([A-Z_]+\),", "", line)
        found += [line for name in names if f"$({name})" in bare]
    return found


def test_no_recipe_pastes_a_value_into_its_command_line(default_bake: Bake) -> None:
    for makefile in (ROOT / "Makefile", default_bake.project / "Makefile"):
        assert pasted(makefile.read_text(encoding="utf-8")) == [], makefile


def test_every_exported_default_is_what_make_holds(default_bake: Bake) -> None:
    """`export NAME` before `NAME ?= default` defines NAME empty first: the default is lost."""
    for folder in (ROOT, default_bake.project):
        text = (folder / "Makefile").read_text(encoding="utf-8")
        defaults = dict(re.findall(r"^([A-Z_]+) \?= *(\S*)$", text, re.M))
        for name in sorted(name for name in exported(text) if defaults.get(name)):
            assert make_value(folder, name), f"{folder / 'Makefile'}: {name} lost its default"


def run_make(folder: Path, target: str, **values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in values.items())],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


GENERATED = [
    ("prepare", "ARGS"),
    ("train", "ARGS"),
    ("compare", "ARGS"),
    ("test", "ARGS"),
    ("sweep", "SPACE"),
    ("submit", "JOB"),
    ("template-status", "TEMPLATE"),
    ("template-status", "REPOS"),
    ("update", "REF"),
    ("template-link", "TEMPLATE"),
]


@pytest.mark.parametrize(("target", "name"), GENERATED, ids=[f"{t}-{n}" for t, n in GENERATED])
def test_a_value_with_command_substitution_stays_text(
    default_bake: Bake, tmp_path: Path, target: str, name: str
) -> None:
    project = tmp_path / "project"
    shutil.copytree(default_bake.project, project, symlinks=True)
    evil = f"$(touch {tmp_path}/dollar)`touch {tmp_path}/tick`"
    extra = {"ALLOW_DIRTY": "1"} if target == "submit" else {}
    run_make(project, target, **{name: evil}, **extra)  # fails: the value is no setting
    assert not (tmp_path / "dollar").exists(), f"make {target} ran $(...) from {name}"
    assert not (tmp_path / "tick").exists(), f"make {target} ran backticks from {name}"


@pytest.mark.parametrize("name", ["REPOS", "TEMPLATE"])
def test_the_templates_own_makefile_keeps_values_text(tmp_path: Path, name: str) -> None:
    evil = f"$(touch {tmp_path}/dollar)`touch {tmp_path}/tick`"
    values = {"REPOS": str(tmp_path / "none.txt"), name: evil}
    done = run_make(ROOT, "fleet", **values)
    assert done.returncode != 0
    assert not (tmp_path / "dollar").exists() and not (tmp_path / "tick").exists()
