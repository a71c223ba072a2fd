"""Bakes of a covering set of answers: exact file sets, no leftover Jinja, lint-clean output."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import git
from engines import BIN, Bake, bake, ruff_problems

ROOT = Path(__file__).resolve().parent.parent
PROJECT_DIR = "{{cookiecutter.project_slug}}"
CC = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))

# Every value of every choice appears at least once, and every preset
# (test_combinations_cover_every_choice checks that).
COMBINATIONS: dict[str, dict[str, str]] = {
    "defaults": {},
    "generic-conda": {
        "cluster": "generic",
        "license": "BSD-3-Clause",
        "python_version": "3.10",
        "environment": "conda",
        "tracking": "tensorboard",
        "example": "no",
        "ci": "github",
        "vscode": "no",
        "git_init": "no",
        "account": "proj_42",
        "mail": "me@example.org",
        "nodes": "2",
        "gpus_per_node": "2",
        "partition": "gpu",
    },
    "grete-apptainer": {
        "license": "Apache-2.0",
        "python_version": "3.12",
        "environment": "apptainer",
        "tracking": "mlflow",
        "ci": "none",
        "snakemake": "yes",
        "partition": "grete",
        "gpus_per_node": "4",
        "time_limit": "2-00:00:00",
    },
    "generic-proprietary": {
        "cluster": "generic",
        "license": "proprietary",
        "python_version": "3.13",
        "environment": "uv",
        "tracking": "wandb",
        "example": "no",
        "vscode": "no",
        "project_name": "Tiny Net",
        "time_limit": "30",
        "memory": "1500M",
    },
}

_CONDITION = re.compile(
    r"\{% if cookiecutter\.(?P<field>\w+) (?P<op>==|!=) '(?P<value>[^']*)' %\}"
    r"(?P<name>[^{]+)\{% endif %\}"
)
_LEFTOVER = re.compile(r"(?<![$])\{\{|\{%|(?<![$])\{#")


def answers_of(overrides: dict[str, str]) -> dict[str, str]:
    """The choice answers of a bake (first choice unless overridden)."""
    chosen = {k: v[0] for k, v in CC.items() if isinstance(v, list) and not k.startswith("_")}
    return chosen | overrides


def expected_files(answers: dict[str, str], slug: str) -> set[str]:
    """The file set a bake must produce, read off the template's file names.

    A conditional file name must be a single comparison of one answer with one value, so
    that each condition is evaluated here independently of the engines.
    """
    wanted: set[str] = set()
    top = ROOT / PROJECT_DIR
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", PROJECT_DIR],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    for line in filter(None, listed):
        rel = Path(line).relative_to(PROJECT_DIR)
        if not (top / rel).is_file() or rel.name == "{{cookiecutter.__answers}}":
            continue
        parts = []
        for source in rel.parts:
            name = re.sub(r"\{\{ ?cookiecutter\.project_slug ?\}\}", slug, source)
            if "{%" in name:
                match = _CONDITION.fullmatch(name)
                assert match, f"file-name condition too complex for the test: {rel}"
                equal = answers[match["field"]] == match["value"]
                if equal != (match["op"] == "=="):
                    break
                name = match["name"]
            parts.append(name)
        else:
            wanted.add("/".join(parts))
    return wanted


def produced_files(project: Path) -> set[str]:
    """Every file of a generated project outside .git."""
    return {
        p.relative_to(project).as_posix()
        for p in project.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(project).parts
    }


def test_combinations_cover_every_choice() -> None:
    for name, choices in CC.items():
        if isinstance(choices, list) and not name.startswith("_"):
            used = {answers_of(c)[name] for c in COMBINATIONS.values()}
            assert used == set(choices), name


@pytest.fixture(scope="module", params=sorted(COMBINATIONS))
def baked(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    overrides = COMBINATIONS[request.param]
    result = bake("cookiecutter", template, tmp_path_factory.mktemp(request.param), overrides)
    assert result.ok, result.stderr[-3000:]
    return result, answers_of(overrides)


def test_exact_file_set(baked: tuple[Bake, dict[str, str]]) -> None:
    result, answers = baked
    assert produced_files(result.project) == expected_files(answers, result.project.name)


def test_license_matches_answer(baked: tuple[Bake, dict[str, str]]) -> None:
    result, answers = baked
    text = (result.project / "LICENSE").read_text("utf-8")
    marker = {
        "MIT": "MIT License",
        "BSD-3-Clause": "BSD 3-Clause License",
        "Apache-2.0": "Apache License",
        "proprietary": "All rights reserved",
    }[answers["license"]]
    assert marker in text
    if answers["license"] != "Apache-2.0":  # the Apache text names no copyright holder
        assert f"Copyright (c) {time.gmtime().tm_year} " in text
    meta = tomllib.loads((result.project / "pyproject.toml").read_text("utf-8"))["project"]
    assert meta.get("license") == (
        None if answers["license"] == "proprietary" else answers["license"]
    )


# Template syntax in a file's name or text: a file that holds none can be copied, not rendered.
SYNTAX = re.compile(r"{{|{%|{#")


def test_files_copied_without_rendering_hold_no_template_syntax() -> None:
    """cookiecutter and cruft copy what `_copy_without_render` matches (the package's modules,
    tests and benchmarks, most of the files): none of it may hold template syntax in its
    text, which would reach the project unrendered. copier renders them all, to the same bytes
    (test_engines.py compares the trees)."""
    listed = git(ROOT, "ls-files", "--", PROJECT_DIR).splitlines()
    inside = [path.removeprefix(f"{PROJECT_DIR}/") for path in listed]
    copied = [
        rel
        for rel in inside
        if any(fnmatch.fnmatch(rel, pattern) for pattern in CC["_copy_without_render"])
    ]
    assert len(copied) > len(inside) // 2, copied  # the saving is worth its rule
    for rel in copied:
        # The name is rendered either way (the package folder's); a condition in it is not
        # (a file the answers leave out would be copied under an empty name).
        assert "{%" not in rel, f"{rel}: a conditional name, matched by _copy_without_render"
        text = (ROOT / PROJECT_DIR / rel).read_text("utf-8")
        assert not SYNTAX.search(text), f"{rel}: template syntax, matched by _copy_without_render"


def test_no_leftover_jinja(baked: tuple[Bake, dict[str, str]]) -> None:
    result, _ = baked
    for path in result.project.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            try:
                text = path.read_text("utf-8")
            except UnicodeDecodeError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                assert not _LEFTOVER.search(line), f"{path.name}:{number}: {line}"


def test_ruff_clean(baked: tuple[Bake, dict[str, str]]) -> None:
    result, _ = baked
    assert ruff_problems(result.project) == ""


def strip_json_comments(text: str) -> str:
    """Drop // and /* */ comments outside strings (VSCode's JSON with comments)."""
    return re.sub(
        r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/',
        lambda m: m.group(0) if m.group(0).startswith('"') else "",
        text,
        flags=re.DOTALL,
    )


class _AnyTagLoader(yaml.SafeLoader):
    """YAML loader that accepts tags such as GitLab's !reference."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_config_files_parse(baked: tuple[Bake, dict[str, str]]) -> None:
    result, _ = baked
    seen = 0
    for path in result.project.rglob("*"):
        if not path.is_file() or ".git" in path.parts:
            continue
        text = (
            path.read_text("utf-8")
            if path.suffix in {".toml", ".yml", ".yaml", ".json", ".cff"}
            else None
        )
        if text is None:
            continue
        if path.suffix == ".toml":
            tomllib.loads(text)
        elif path.suffix == ".json":
            json.loads(strip_json_comments(text) if ".vscode" in path.parts else text)
        else:
            list(yaml.load_all(text, Loader=_AnyTagLoader))
        seen += 1
    assert seen >= 1


def shell_scripts(project: Path) -> list[Path]:
    """Files that are shell scripts by suffix or by shebang."""
    found = []
    for path in project.rglob("*"):
        if not path.is_file() or ".git" in path.parts:
            continue
        if path.suffix in {".sh", ".sbatch", ".bash"}:
            found.append(path)
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if re.match(rb"#!\s*/(usr/)?bin/(env )?(ba)?sh\b", first):
            found.append(path)
    return sorted(found)


def test_shell_scripts_pass_bash_n_and_shellcheck(baked: tuple[Bake, dict[str, str]]) -> None:
    result, _ = baked
    for script in shell_scripts(result.project):
        syntax = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert syntax.returncode == 0, f"{script.name}: {syntax.stderr}"
        # From the project root, as the scripts are run: `source slurm/common.sh` resolves.
        lint = subprocess.run(
            [
                str(BIN / "shellcheck"),
                "-x",
                "--shell=bash",
                str(script.relative_to(result.project)),
            ],
            cwd=result.project,
            capture_output=True,
            text=True,
            check=False,
        )
        assert lint.returncode == 0, f"{script.name}:\n{lint.stdout}"


def test_first_commit_only_when_asked(baked: tuple[Bake, dict[str, str]]) -> None:
    result, answers = baked
    has_repo = (result.project / ".git").is_dir()
    assert has_repo == (answers["git_init"] == "yes")
    if has_repo:
        log = git(result.project, "log", "--format=%an <%ae>|%s").splitlines()
        assert log == ["Jane Doe <jane.doe@example.org>|Initial commit from hpc-ml-template"]
        status = git(result.project, "status", "--porcelain")
        assert status == "", "the first commit must hold every generated file"
    assert "Next steps:" in result.stdout


def test_shipped_raw_data_is_read_only(baked: tuple[Bake, dict[str, str]]) -> None:
    result, answers = baked
    raw = [p for p in (result.project / "data" / "raw").iterdir() if p.name != ".gitkeep"]
    assert len(raw) == (2 if answers["example"] == "yes" else 0)  # digits and the LM's text
    for path in raw:
        assert path.stat().st_mode & 0o222 == 0, f"{path.name} is writable"


@pytest.mark.parametrize(
    ("answers", "request_line"),
    [
        ({}, "#SBATCH --gpus-per-node=A100:1"),
        ({"partition": "grete-h100", "gpus_per_node": "4"}, "#SBATCH --gpus-per-node=H100:4"),
        ({"cluster": "generic", "partition": "gpu", "gpus_per_node": "2"}, "#SBATCH --gres=gpu:2"),
    ],
)
def test_gpu_request_follows_the_partition(
    answers: dict[str, str], request_line: str, template: Path, tmp_path: Path
) -> None:
    result = bake("cookiecutter", template, tmp_path, {**answers, "git_init": "no"})
    assert result.ok, result.stderr[-2000:]
    for job in ("train.sbatch", "sweep.sbatch"):
        lines = (result.project / "slurm" / job).read_text("utf-8").splitlines()
        assert request_line in lines, job
