"""Where this project stands against its template (`make template-status`).

Reads the release this project records (``.hpc-ml-template.json``), looks up the newest
release of the template it came from (the source that copier's or cruft's answers file
records, or ``--template``) and prints the changelog entries in between and the files an
update would touch, split by who owns them. It changes nothing here: the template is
cloned into a temporary folder. Standard library and git only, so it runs before
`make install` and with any Python 3.10+.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

RECORD = ".hpc-ml-template.json"
COPIER_ANSWERS = ".copier-answers.yml"
CRUFT_STATE = ".cruft.json"
# copier's short forms of code-host URLs, as its answers file may record them.
SHORT_HOSTS = {"gh:": "https://github.com/", "gl:": "https://gitlab.com/"}
RELEASE_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
CHANGELOG_HEADING = re.compile(r"^## (\d+)\.(\d+)\.(\d+)\b")
# How the template names files (escaped braces: this module itself is never rendered).
PROJECT_FOLDER = re.compile(r"^\{\{\s*cookiecutter\.project_slug\s*\}\}$")
CONDITION = re.compile(
    r"\{[%]-?\s*if\s+cookiecutter\.(\w+)\s*==\s*'([^']*)'\s*-?%\}(.*?)\{[%]-?\s*endif\s*-?%\}"
)
VARIABLE = re.compile(r"\{\{\s*cookiecutter\.(\w+)\s*\}\}")
CHANGE_WORDS = {"A": "added", "M": "modified", "D": "removed", "T": "modified"}

Version = tuple[int, int, int]


class StatusError(Exception):
    """A problem that ends the report with one line."""


@dataclass
class Change:
    """One project file that differs between two template releases."""

    status: str  # added, modified, removed
    path: str  # relative to the project root


def _git(*args: str, cwd: Path | None = None) -> str:
    git = shutil.which("git")
    if git is None:
        raise StatusError("git not found on PATH")
    done = subprocess.run(  # noqa: S603  (fixed git commands)
        [git, *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise StatusError(f"git {args[0]}: {last}")
    return done.stdout


def _version(text: str) -> Version:
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise StatusError(f"{RECORD}: version {text!r} is not X.Y.Z")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _show(version: Version) -> str:
    return ".".join(map(str, version))


def load_record(root: Path) -> dict[str, Any]:
    """The release record the template wrote into this project."""
    path = root / RECORD
    if not path.is_file():
        raise StatusError(f"{RECORD} not found: run this in a project made by hpc-ml-template")
    record: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return record


def _yaml_scalar(text: str) -> str:
    """The value of a one-line YAML scalar as copier writes it (plain or quoted)."""
    text = text.strip()
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    if text.startswith('"'):
        value: str = json.loads(text)
        return value
    return text


def recorded_source(root: Path) -> tuple[str, str] | None:
    """(template source, commit) from copier's or cruft's answers file, if there is one."""
    copier = root / COPIER_ANSWERS
    if copier.is_file():
        found = {}
        for line in copier.read_text("utf-8").splitlines():
            key, _, value = line.partition(":")
            if key in {"_src_path", "_commit"}:
                found[key] = _yaml_scalar(value)
        if "_src_path" in found:
            return found["_src_path"], found.get("_commit", "")
    cruft = root / CRUFT_STATE
    if cruft.is_file():
        state = json.loads(cruft.read_text("utf-8"))
        return state["template"], state.get("commit") or ""
    return None


def clone_url(source: str) -> str:
    """A URL or path git can clone, from copier's short forms too."""
    for short, url in SHORT_HOSTS.items():
        if source.startswith(short):
            return url + source.removeprefix(short)
    return source


def releases(repo: Path) -> dict[Version, str]:
    """Release tags (vX.Y.Z) of the template repository by version."""
    found = {}
    for tag in _git("tag", "--list", "v*", cwd=repo).split():
        if match := RELEASE_TAG.match(tag):
            found[(int(match[1]), int(match[2]), int(match[3]))] = tag
    return found


def changelog_between(text: str, since: Version, upto: Version) -> str:
    """The changelog entries after ``since`` up to and including ``upto``."""
    kept: list[str] = []
    keep = False
    for line in text.splitlines():
        if match := CHANGELOG_HEADING.match(line):
            version = (int(match[1]), int(match[2]), int(match[3]))
            keep = since < version <= upto
        elif line.startswith("# "):
            keep = False
        if keep:
            kept.append(line)
    return "\n".join(kept).strip()


def project_path(template_path: str, answers: dict[str, str]) -> str | None:
    """Where a template file lands in this project (None: not part of this project)."""
    folder, _, rest = template_path.partition("/")
    if not PROJECT_FOLDER.match(folder) or not rest:
        return None
    name = CONDITION.sub(
        lambda m: m[3] if answers.get(m[1]) == m[2] else "",
        rest,
    )
    name = VARIABLE.sub(lambda m: answers.get(m[1], ""), name)
    parts = name.split("/")
    return None if "" in parts else name


def is_project_owned(path: str, patterns: list[str]) -> bool:
    """True when a pattern of the project-owned list matches the path.

    Patterns are relative to the project root: ``*`` matches within one path segment and a
    trailing ``/**`` matches everything below a folder.
    """
    parts = path.split("/")
    for pattern in patterns:
        wanted = pattern.split("/")
        below = wanted[-1] == "**"
        if below:
            wanted = wanted[:-1]
        fits = len(parts) == len(wanted) or (below and len(parts) > len(wanted))
        pairs = zip(parts[: len(wanted)], wanted, strict=True)
        if fits and all(fnmatchcase(part, want) for part, want in pairs):
            return True
    return False


def changes(repo: Path, base: str, head: str, answers: dict[str, str]) -> list[Change]:
    """Project files whose template source differs between two template commits."""
    out = _git("diff", "--name-status", "--no-renames", "-z", base, head, cwd=repo)
    fields = out.split("\0")[:-1]  # -z ends every field with NUL
    found = []
    for status, path in zip(fields[::2], fields[1::2], strict=True):
        target = project_path(path, answers)
        if target is not None:
            found.append(Change(CHANGE_WORDS.get(status[:1], "changed"), target))
    return sorted(found, key=lambda change: change.path)


def _base_ref(repo: Path, commit: str, version: Version, tags: dict[Version, str]) -> str:
    """The template commit this project was made from: recorded commit, else its tag."""
    for ref in (commit, tags.get(version, "")):
        if ref:
            try:
                return _git("rev-parse", "--verify", "--quiet", f"{ref}^0", cwd=repo)
            except StatusError:
                continue
    raise StatusError(f"release {_show(version)} is not in the template's history")


def report(root: Path, template: str | None) -> str:
    """The status of the project at ``root`` as text."""
    record = load_record(root)
    current = _version(record["version"])
    recorded = recorded_source(root)
    source = template or (recorded[0] if recorded else None)
    if not source:
        raise StatusError(
            "no template source recorded (no .copier-answers.yml or .cruft.json): "
            "pass TEMPLATE=<template url or path>"
        )
    commit = recorded[1] if recorded and not template else ""
    lines = [f"This project: {record['template']} {_show(current)}", f"Template: {source}"]
    with tempfile.TemporaryDirectory(prefix="template-status-") as tmp:
        repo = Path(tmp) / "template"
        _git("clone", "--quiet", "--no-checkout", clone_url(source), str(repo))
        tags = releases(repo)
        if not tags:
            raise StatusError(f"{source} has no release tags (vX.Y.Z)")
        newest = max(tags)
        lines.append(f"Newest release: {_show(newest)} ({tags[newest]})")
        if newest <= current:
            lines.append(f"Up to date: no release after {_show(current)}.")
            return "\n".join(lines)
        changelog = _git("show", f"{tags[newest]}:CHANGELOG.md", cwd=repo)
        notes = changelog_between(changelog, current, newest)
        base = _base_ref(repo, commit, current, tags).strip()
        touched = changes(repo, base, tags[newest], record["answers"])
    owned = record["project_owned"]
    theirs = [c for c in touched if not is_project_owned(c.path, owned)]
    mine = [c for c in touched if is_project_owned(c.path, owned)]
    lines += ["", f"Changes since {_show(current)} (CHANGELOG.md):", "", notes or "(none)", ""]
    lines.append(f"An update would change these template-owned files ({len(theirs)}):")
    lines += [f"  {c.status:<9} {c.path}" for c in theirs] or ["  (none)"]
    lines.append(f"It leaves these alone, as this project owns them ({len(mine)}):")
    lines += [f"  {c.status:<9} {c.path}" for c in mine] or ["  (none)"]
    lines += [
        "",
        "A file is listed when its template source changed; a change inside a part your",
        "answers leave out shows here but changes nothing. Commit your work, then take the",
        f"release with `copier update --trust` or `cruft update --checkout {tags[newest]}`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the template status of the project in the current folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", help="template URL or path (default: the recorded one)")
    args = parser.parse_args(argv)
    try:
        print(report(Path.cwd(), args.template or None))
    except StatusError as exc:
        print(f"template-status: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
