"""Run the real cookiecutter, copier and cruft command-line tools on the template."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from sync_questions import load_rules

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("cookiecutter", "copier", "cruft")
# Files each engine adds for its own bookkeeping; everything else must be identical.
BOOKKEEPING = {".copier-answers.yml", ".cruft.json"}


@dataclass
class Bake:
    """The outcome of one generation."""

    engine: str
    returncode: int
    stdout: str
    stderr: str
    project: Path  # where the project is (or would have been) written

    @property
    def ok(self) -> bool:
        """True when the engine succeeded and wrote the project."""
        return self.returncode == 0 and self.project.is_dir()


rules = load_rules()


def _tool(name: str) -> str:
    found = BIN / name
    return str(found) if found.exists() else shutil.which(name) or name


def shell_env(**extra: str) -> dict[str, str]:
    """This process's environment as a user's shell has it: no outer make around it.

    Under `make test-all` the tests inherit make's recursion variables, and a make they start
    then prints "make[1]: ***" and takes the outer command line's flags and overrides.
    """
    outer = {"MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"}
    return {**{k: v for k, v in os.environ.items() if k not in outer}, **extra}


def make_value(folder: Path, name: str, *args: str) -> str:
    """What the Makefile in ``folder`` holds in ``name`` (with the ``VAR=value`` of ``args``).

    The value an exported variable gives a recipe's "$NAME", which `make -n` does not show.
    """
    show = ["make", "-s", "--eval", f"show-value: ; @echo $({name})", "show-value", *args]
    done = subprocess.run(
        show, cwd=folder, env=shell_env(), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def bake(engine: str, template: Path, out: Path, answers: dict[str, str], **env: str) -> Bake:
    """Generate a project with one engine; ``out`` is an empty parent folder."""
    slug = answers.get("project_slug") or rules.to_slug(
        answers.get("project_name", "My HPC Project"), max_length=rules.MAX_SLUG
    )
    out.mkdir(parents=True, exist_ok=True)
    if engine == "cookiecutter":
        args = [_tool("cookiecutter"), "--no-input", "-o", str(out), str(template)]
        args += [f"{k}={v}" for k, v in answers.items()]
    elif engine == "copier":
        args = [_tool("copier"), "copy", "--defaults", "--trust", "--quiet", "--vcs-ref", "HEAD"]
        args += [f"--data={k}={v}" for k, v in answers.items()]
        args += [str(template), str(out / slug)]
    elif engine == "cruft":
        args = [_tool("cruft"), "create", "--no-input", "--output-dir", str(out)]
        args += ["--extra-context", json.dumps(answers), str(template)]
    else:
        raise ValueError(engine)
    environment = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **env}
    done = subprocess.run(
        args, capture_output=True, text=True, check=False, env=environment, cwd=out
    )
    return Bake(engine, done.returncode, done.stdout, done.stderr, out / slug)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (no .git, no engine bookkeeping) with its bytes and mode."""
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == ".git" or str(rel) in BOOKKEEPING or not path.is_file():
            continue
        mode = b"x" if os.access(path, os.X_OK) else b"-"
        files[rel.as_posix()] = mode + path.read_bytes()
    return files


def ruff_problems(project: Path) -> str:
    """What `ruff check` and `ruff format --check` report on a project ("" when clean)."""
    report = ""
    for args in (["check"], ["format", "--check"]):
        command = [_tool("ruff"), *args, "--no-cache", "."]
        done = subprocess.run(command, cwd=project, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            report += done.stdout + done.stderr
    return report


def module_at(path: Path, name: str, *, register: bool = False) -> ModuleType:
    """The Python file at `path` loaded as module `name` (a hook, a tool, a generated module).

    `register` puts it into sys.modules first, where dataclasses look their module up.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def status_tool() -> ModuleType:
    """The generated project's tools/template_status.py, loaded as a module once."""
    path = ROOT / "{{cookiecutter.project_slug}}" / "tools" / "template_status.py"
    if "template_status" in sys.modules:
        return sys.modules["template_status"]
    return module_at(path, "template_status", register=True)
