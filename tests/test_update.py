"""Update path: a project generated from an older release takes a newer one, edits kept."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import yaml
from conftest import git, snapshot_template
from engines import BIN, rules

USER_NOTE = "\n## My notes\n\nThe learning rate 3e-4 works best here.\n"
TEMPLATE_LINE = "Template release 0.2.0 added this line."


def _release_change(template: Path) -> None:
    """Make a template release that edits a file the user also edits and adds a file."""
    readme = template / "{{cookiecutter.project_slug}}" / "README.md"
    text = readme.read_text("utf-8")
    marker = "## First steps\n"
    assert marker in text
    readme.write_text(text.replace(marker, f"{TEMPLATE_LINE}\n\n{marker}", 1), "utf-8")
    (template / "{{cookiecutter.project_slug}}" / "CHANGELOG.md").write_text(
        "# Changelog of {{ cookiecutter.project_name }}\n", "utf-8"
    )
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "release 0.2.0")
    git(template, "tag", "v0.2.0")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False, env=env)


def _user_edits(project: Path) -> None:
    with (project / "README.md").open("a", encoding="utf-8") as handle:
        handle.write(USER_NOTE)
    (project / "NOTES.md").write_text("my own file\n", "utf-8")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my edits")


def _assert_updated(project: Path) -> None:
    readme = (project / "README.md").read_text("utf-8")
    assert USER_NOTE in readme, "the user's edit was lost"
    assert TEMPLATE_LINE in readme, "the template change did not arrive"
    assert (project / "CHANGELOG.md").read_text("utf-8") == "# Changelog of Heat Sim\n"
    assert (project / "NOTES.md").is_file()
    for path in project.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            assert "<<<<<<<" not in path.read_text("utf-8", errors="replace"), path
    nested = [p for p in project.rglob(".git") if p != project / ".git"]
    assert nested == [], "an update created a nested repository"


def _history(project: Path) -> list[str]:
    return git(project, "log", "--format=%s").splitlines()


def test_copier_update_keeps_edits_and_brings_release(tmp_path: Path) -> None:
    template = snapshot_template(tmp_path / "template", tag="v0.1.0")
    project = tmp_path / "heat_sim"
    created = _run(
        [
            str(BIN / "copier"),
            "copy",
            "--defaults",
            "--trust",
            "--quiet",
            "--data=project_name=Heat Sim",
            str(template),
            str(project),
        ],
        tmp_path,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text("utf-8"))
    assert answers["_commit"] == "v0.1.0" and answers["project_slug"] == "heat_sim"
    assert _history(project) == ["Initial commit from hpc-ml-template"]
    _user_edits(project)
    _release_change(template)

    updated = _run([str(BIN / "copier"), "update", "--defaults", "--trust", "--quiet"], project)
    assert updated.returncode == 0, updated.stderr[-2000:]
    _assert_updated(project)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text("utf-8"))
    assert answers["_commit"] == "v0.2.0"
    # The first commit is never made again: history is the user's, untouched.
    assert _history(project) == ["my edits", "Initial commit from hpc-ml-template"]


def test_cruft_update_keeps_edits_and_brings_release(tmp_path: Path) -> None:
    template = snapshot_template(tmp_path / "template", tag="v0.1.0")
    created = _run(
        [
            str(BIN / "cruft"),
            "create",
            "--no-input",
            "--checkout",
            "v0.1.0",
            "--extra-context",
            '{"project_name": "Heat Sim"}',
            str(template),
        ],
        tmp_path,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    project = tmp_path / "heat_sim"
    assert not (project / ".git").exists(), "cruft create must leave git to the user"
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated")
    _user_edits(project)
    _release_change(template)

    updated = _run([str(BIN / "cruft"), "update", "-y", "--checkout", "v0.2.0"], project)
    assert updated.returncode == 0, updated.stderr[-2000:] + updated.stdout[-2000:]
    _assert_updated(project)
    assert _history(project) == ["my edits", "generated"]


def _preset_release(template: Path) -> str:
    """Make a release that changes a preset (and the fingerprint `make sync` writes)."""
    cc_json = template / "cookiecutter.json"
    cc = json.loads(cc_json.read_text("utf-8"))
    cc["_presets"]["grete"]["login_host"] = "glogin-new.hpc.gwdg.de"
    cc_json.write_text(json.dumps(cc, indent=2, ensure_ascii=False) + "\n", "utf-8")
    hook = template / "hooks" / "pre_gen_project.py"
    fresh = f'PRESETS_SHA256 = "{rules.presets_fingerprint(cc["_presets"])}"'
    hook.write_text(re.sub(r'PRESETS_SHA256 = "[0-9a-f]+"', fresh, hook.read_text("utf-8")))
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "release 0.2.0: a preset changed")
    git(template, "tag", "v0.2.0")
    return "glogin-new.hpc.gwdg.de"


def test_cruft_update_takes_changed_presets(tmp_path: Path) -> None:
    """cruft update recomputes private values (it never passes the stored ones back)."""
    template = snapshot_template(tmp_path / "template", tag="v0.1.0")
    create = [str(BIN / "cruft"), "create", "--no-input", "--checkout", "v0.1.0", str(template)]
    assert _run(create, tmp_path).returncode == 0
    project = tmp_path / "my_hpc_project"
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated")
    host = _preset_release(template)

    update = [str(BIN / "cruft"), "update", "-y", "--checkout", "v0.2.0"]
    updated = _run(update, project)
    assert updated.returncode == 0, updated.stderr[-2000:] + updated.stdout[-2000:]
    assert host in (project / "README.md").read_text("utf-8")
