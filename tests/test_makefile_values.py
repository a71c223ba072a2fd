"""Values passed to make (ARGS=, TEMPLATE=, REF=, ...) are text, never shell code to run.

A recipe that pastes `$(ARGS)` into its command line hands `$(...)` and backticks in the value
to the shell, which runs them. Both Makefiles export the values instead and read them as
`$$VAR`. Checked twice: no recipe line of either Makefile pastes an exported value, and each
target that takes one is run with a value that would create a file if the shell ran it.

And each value reaches its program as the user quoted it: every target of the generated
project that takes one runs a stub in place of the program, which prints the arguments it got
(ARGS split into words as a shell splits them, no quote left in a word, no glob matched against
the project's files); the `make compare` lines of the docs and of `make help` run as printed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from engines import ROOT, make_value, shell_env

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


def run_make(
    folder: Path, target: str, env: dict[str, str] | None = None, **values: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in values.items())],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=shell_env(**(env or {})),
    )


GENERATED = [
    ("data", "ARGS"),
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


# Words as a user quotes them: a glob quoted and one not (README.md is in the project root),
# two words kept one by quotes, an escaped space, and shell syntax that must stay text.
ARGS = """'lr-*' *.md "two words" a\\ b ';' 'a>b|c&'"""
WORDS = ["lr-*", "*.md", "two words", "a b", ";", "a>b|c&"]
TOOLS = {"TOOLS_PY": sys.executable}  # tools/with_args.py on a real Python, the program a stub
# target, the values passed, the arguments the stub must receive (after the program).
QUOTED = [
    ("data", {"ARGS": ARGS, **TOOLS}, ["-m", "my_hpc_project", "prepare", *WORDS]),
    ("train", {"ARGS": ARGS, **TOOLS}, ["-m", "my_hpc_project", "train", *WORDS]),
    ("compare", {"ARGS": ARGS, **TOOLS}, ["-m", "my_hpc_project", "compare", *WORDS]),
    ("test", {"ARGS": ARGS, **TOOLS}, ["-m", "pytest", "-m", "not slow", "-n", "2", *WORDS]),
    ("test-all", {"ARGS": ARGS, **TOOLS}, ["-m", "pytest", "-n", "2", *WORDS]),
    (
        "sweep",
        {"ARGS": ARGS, "SPACE": "my space.toml", "DRY": "1", **TOOLS},
        ["-m", "my_hpc_project", "sweep", "--dry-run", "my space.toml", *WORDS],
    ),
    (
        "submit",
        {"ARGS": ARGS, "JOB": "slurm/my job.sbatch", "ALLOW_DIRTY": "1", **TOOLS},
        ["slurm/my job.sbatch", *WORDS],
    ),
    (
        "template-status",
        {"TEMPLATE": "a b", "REPOS": "r s.txt", "JSON": "1"},
        ["tools/template_status.py", "--template", "a b", "--json", "--repos-file", "r s.txt"],
    ),
    ("update", {"REF": "v1 x"}, ["tools/template_update.py", "--ref", "v1 x"]),
    ("template-link", {"TEMPLATE": "a b"}, ["tools/template_update.py", "--link", "a b"]),
    (
        "wheels",
        {"TORCH_VARIANT": "cpu x"},
        ["tools/install.py", "venv", "--variant", "cpu x", "--download"],
    ),
]


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with `stub` and `sbatch`: programs that print the arguments they get, as JSON."""
    folder = tmp_path_factory.mktemp("stub")
    for name in ("stub", "sbatch"):
        path = folder / name
        path.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
        path.chmod(0o755)
    return folder


def stub_argv(project: Path, stub: Path, target: str, **values: str) -> list[str]:
    """The arguments the stub got when `make target` ran with `values` in `project`."""
    programs = {name: str(stub / "stub") for name in ("PY", "PYTHON", "TOOLS_PY")}
    path = {"PATH": f"{stub}:{shell_env()['PATH']}"}  # sbatch
    done = run_make(project, target, env=path, **{**programs, **values})
    printed = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert printed, f"make {target}: the stub did not run: {done.stdout}{done.stderr}"
    return json.loads(printed[0])


@pytest.mark.parametrize(("target", "values", "argv"), QUOTED, ids=[q[0] for q in QUOTED])
def test_a_value_reaches_the_program_as_quoted(
    default_bake: Bake, stub: Path, target: str, values: dict[str, str], argv: list[str]
) -> None:
    assert (default_bake.project / "README.md").is_file()  # what an unquoted *.md would match
    assert stub_argv(default_bake.project, stub, target, **values) == argv


@pytest.mark.parametrize("target", ["test", "test-all"])
def test_the_templates_pytest_args_reach_pytest_as_quoted(
    stub: Path, tmp_path: Path, target: str
) -> None:
    """The template's own `make test PYTEST_ARGS="-k 'a or b'"`: one word per quoted part."""
    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    (venv_bin / "python").symlink_to(stub / "stub")
    stamp = tmp_path / "installed"  # newer than requirements-test.txt: no install
    stamp.touch()
    done = run_make(ROOT, target, BIN=str(venv_bin), STAMP=str(stamp), PYTEST_ARGS=ARGS)
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(printed) == (2 if target == "test-all" else 1), done.stdout + done.stderr
    for argv in printed:  # test-all: the tests without Slurm, then the Slurm tests
        assert argv[:2] == ["-m", "pytest"] and argv[-len(WORDS) :] == WORDS, argv


def test_unbalanced_quotes_in_args_stop_with_one_line(default_bake: Bake, stub: Path) -> None:
    done = run_make(default_bake.project, "compare", PY=str(stub / "stub"), ARGS="'lr-*", **TOOLS)
    assert done.returncode != 0 and not done.stdout
    assert done.stderr.splitlines()[0] == "error: ARGS: no closing quotation in 'lr-*"


# `make help`'s example with a flag after it, as typed inside ARGS="..."
TYPED = "'lr-*' --metric accuracy"


def test_the_make_compare_lines_shown_run_as_printed(default_bake: Bake, stub: Path) -> None:
    """docs/compare-runs.md's line and `make help`'s example, as a shell hands them to make."""
    page = (default_bake.project / "docs" / "compare-runs.md").read_text("utf-8")
    shown = [line for line in page.splitlines() if line.startswith("make compare ARGS=")]
    help_text = run_make(default_bake.project, "help").stdout
    (example,) = re.findall(r"make compare .*\((ARGS=\S+)\)", help_text)
    shown += [f"make compare {example}", f'make compare ARGS="{TYPED}"']
    assert len(shown) == 3, shown
    for line in shown:
        make, target, *values = shlex.split(line)  # what the shell gives make
        assert (make, target) == ("make", "compare")
        given = dict(value.split("=", 1) for value in values)
        argv = stub_argv(default_bake.project, stub, "compare", **given, **TOOLS)
        assert argv == ["-m", "my_hpc_project", "compare", *shlex.split(given["ARGS"])], line
        assert not any("'" in word for word in argv), line  # the pattern, not its quotes
