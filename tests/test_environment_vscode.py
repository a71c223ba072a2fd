"""VSCode workspace files, the remote-work guide and the ssh_config example.

The .vscode files are JSON with comments; they are parsed with the small scanner in
envcases.py (tested here on its own first) and checked against the baked project: the
interpreter is where `make install` puts it, tests and module names exist, the debug
configuration for a tiny training run really runs. The ssh_config example is resolved by
OpenSSH itself (`ssh -G`, which reads the configuration without connecting).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from engines import Bake
from envcases import (
    CASES,
    PRESETS,
    answers_of,
    baked,
    baked_case,
    env_dir,
    loads_jsonc,
    pyproject,
    run,
    working_copy,
)

VSCODE_FILES = ("settings.json", "extensions.json", "launch.json")


VSCODE_CASES = sorted(c for c in CASES if answers_of(c)["vscode"] == "yes")


@pytest.fixture(scope="module", params=sorted(CASES))
def case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    return baked_case(request.param, template, tmp_path_factory)


@pytest.fixture(scope="module", params=VSCODE_CASES)
def vscode_case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    return baked_case(request.param, template, tmp_path_factory)


# --- the JSON-with-comments parser -------------------------------------------------------------


def test_jsonc_keeps_comment_markers_inside_strings() -> None:
    text = '{"url": "https://x/y", "glob": "**/*.sif", "c": "/* no */", "q": "a\\"//b"} // end'
    assert loads_jsonc(text) == {
        "url": "https://x/y",
        "glob": "**/*.sif",
        "c": "/* no */",
        "q": 'a"//b',
    }


def test_jsonc_drops_comments_and_trailing_commas() -> None:
    text = '// head\n{\n  "a": [1, 2, /* two */],\n  /* block\n  */ "b": {"c": 3,}, // tail\n}\n'
    assert loads_jsonc(text) == {"a": [1, 2], "b": {"c": 3}}


@pytest.mark.parametrize("text", ['{"a": "open}', '{"a": 1 /* open', '{"a": 1,, }', "{a: 1}"])
def test_jsonc_rejects_broken_input(text: str) -> None:
    with pytest.raises(ValueError):  # json.JSONDecodeError is a ValueError
        loads_jsonc(text)


# --- workspace files ---------------------------------------------------------------------------


def _vscode(project: Path, name: str) -> dict:
    return loads_jsonc((project / ".vscode" / name).read_text("utf-8"))


def test_vscode_files_only_when_asked(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    present = [name for name in VSCODE_FILES if (result.project / ".vscode" / name).exists()]
    assert present == (list(VSCODE_FILES) if answers["vscode"] == "yes" else [])
    guide = result.project / "docs" / "vscode-remote.md"
    assert guide.exists() == (answers["vscode"] == "yes")
    for name in present:
        _vscode(result.project, name)  # parses


def test_settings_match_the_project(vscode_case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = vscode_case
    project = result.project
    settings = _vscode(project, "settings.json")
    # The interpreter is the one `make install` creates.
    interpreter = settings["python.defaultInterpreterPath"]
    assert interpreter == f"${{workspaceFolder}}/{env_dir(answers)}/bin/python"
    makefile = (project / "Makefile").read_text("utf-8")
    assert re.search(rf"^ENV_DIR := {re.escape(env_dir(answers))}$", makefile, re.MULTILINE)
    # Tests: pytest on the folders pyproject.toml names, not unittest.
    assert settings["python.testing.pytestEnabled"] is True
    assert settings["python.testing.unittestEnabled"] is False
    assert (
        settings["python.testing.pytestArgs"]
        == pyproject(project)["tool"]["pytest"]["ini_options"]["testpaths"]
    )
    # Ruff formats and fixes on save.
    python = settings["[python]"]
    assert python["editor.defaultFormatter"] == "charliermarsh.ruff"
    assert python["editor.formatOnSave"] is True
    assert set(python["editor.codeActionsOnSave"]) == {
        "source.fixAll.ruff",
        "source.organizeImports.ruff",
    }
    # Neither the watcher nor search walks data, results, environments or images.
    for key in ("files.watcherExclude", "search.exclude"):
        globs = " ".join(g for g, on in settings[key].items() if on)
        for folder in ("data", "runs", "logs", "checkpoints", ".venv", ".conda", "*.sif"):
            assert f"**/{folder}" in globs, f"{key} misses {folder}"
    extensions = _vscode(project, "extensions.json")["recommendations"]
    assert {"ms-python.python", "charliermarsh.ruff", "ms-vscode-remote.remote-ssh"} <= set(
        extensions
    )
    assert python["editor.defaultFormatter"] in extensions


def test_launch_configurations_match_the_project(vscode_case: tuple[Bake, dict[str, str]]) -> None:
    result, _ = vscode_case
    project, slug = result.project, result.project.name
    configs = {c["name"]: c for c in _vscode(project, "launch.json")["configurations"]}
    assert all(c["type"] == "debugpy" and c["request"] == "launch" for c in configs.values())
    modules = {c["module"] for c in configs.values() if "module" in c}
    assert modules == {slug, "pytest"}
    assert (project / "src" / slug / "__main__.py").is_file()
    train = configs[f"{slug}: tiny training run"]
    assert train["args"][0] == "train"
    assert any("debug-test" in c.get("purpose", []) for c in configs.values())
    # The guide names the debug configurations it tells the user to run.
    guide = (project / "docs" / "vscode-remote.md").read_text("utf-8")
    assert f'"{slug}: tiny training run"' in guide


def test_tiny_training_run_from_launch_json_really_runs(
    template: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The debug configuration's command line trains on the CPU (what F5 would run)."""
    result = baked("venv-grete", template, tmp_path_factory)
    project = working_copy(result.project, tmp_path)
    slug = project.name
    configs = {c["name"]: c for c in _vscode(project, "launch.json")["configurations"]}
    env = {"PYTHONPATH": str(project / "src"), "CUDA_VISIBLE_DEVICES": "", "RUN_NAME": None}
    for name in (f"{slug}: prepare data", f"{slug}: tiny training run"):
        config = configs[name]
        assert config["cwd"] == "${workspaceFolder}"
        done = run([sys.executable, "-m", config["module"], *config["args"]], project, env)
        assert done.returncode == 0, f"{name}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    run_name = next(
        a.split("=", 1)[1]
        for a in configs[f"{slug}: tiny training run"]["args"]
        if a.startswith("run.name=")
    )
    assert (project / "runs" / run_name / "metrics.csv").is_file()


# --- ssh_config and the guide ------------------------------------------------------------------


def _ssh_resolve(config: Path, host: str) -> dict[str, str]:
    done = run(["ssh", "-G", "-F", str(config), host], config.parent)
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def test_ssh_config_resolves_with_openssh(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    preset = PRESETS[answers["cluster"]]
    host = answers["cluster"]
    config = result.project / "docs" / "ssh_config.example"
    login = _ssh_resolve(config, host)
    assert login["hostname"] == preset["login_host"]
    assert login["controlmaster"] == "auto"
    assert login["controlpersist"] != "no"
    assert "proxyjump" not in login
    node = _ssh_resolve(config, f"{host}-node")
    assert node["proxyjump"] == host
    assert node["user"] == login["user"] == "YOUR_USER"


def test_guide_matches_ssh_config_and_preset(vscode_case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = vscode_case
    preset = PRESETS[answers["cluster"]]
    host = answers["cluster"]
    guide = (result.project / "docs" / "vscode-remote.md").read_text("utf-8")
    hosts = re.findall(
        r"^Host (\S+)$", (result.project / "docs" / "ssh_config.example").read_text(), re.MULTILINE
    )
    assert hosts == [host, f"{host}-node"]
    for name in hosts:
        assert f"`{name}`" in guide
    assert "remote.SSH.serverInstallPath" in guide
    job = re.search(
        r"^sbatch --job-name=vscode (.*?)--wrap=\"sleep infinity\"$",
        guide,
        re.MULTILINE | re.DOTALL,
    )
    assert job, "the guide shows the placeholder job"
    assert f"--partition={preset['interactive_partition']}" in job[1]
    assert preset["interactive_gpu_request"] in job[1]
    assert "scancel --name=vscode" in guide
    interpreter = f"{env_dir(answers)}/bin/python"
    assert interpreter in guide
