"""Where this project stands against its template (`make template-status`).

Reads the release this project records (``.hpc-ml-template.json``), looks up the newest
release of the template it came from (the source that copier's or cruft's answers file
records, or ``--template``) and prints the changelog entries in between, the files an
update would touch, split by who owns them, and the template-owned files this project
changed that the update changes too, each with the outcome of a trial three-way merge
(where an update will conflict). It changes nothing here: the template is cloned into a
temporary folder. Standard library and git only, so it runs before `make install` and with
any Python 3.10+.

Given repositories (paths or git URLs, as arguments or one per line in ``--repos-file``),
it prints one table for all of them instead: a team's fleet at a glance.

"Behind" means: a release tag (vX.Y.Z) newer than the recorded release exists. Unreleased
template commits do not count (``cruft check`` compares with the template's HEAD instead).
Exit status, for CI: 0 up to date, 1 no answer (an error), 3 behind, 4 conflict markers
or rejected hunks left (an update not finished); for a table, the worst of its rows.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

RECORD = ".hpc-ml-template.json"
COPIER_ANSWERS = ".copier-answers.yml"
CRUFT_STATE = ".cruft.json"
# copier's short forms of code-host URLs, as its answers file may record them.
SHORT_HOSTS = {"gh:": "https://github.com/", "gl:": "https://gitlab.com/"}
# The engine that took each answers file (a project without either: plain cookiecutter).
ENGINES = {COPIER_ANSWERS: "copier", CRUFT_STATE: "cruft"}
RELEASE_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
CHANGELOG_HEADING = re.compile(r"^## (\d+)\.(\d+)\.(\d+)\b")
# How the template names files (escaped braces: this module itself is never rendered).
PROJECT_FOLDER = re.compile(r"^\{\{\s*cookiecutter\.project_slug\s*\}\}$")
CONDITION = re.compile(
    r"\{[%]-?\s*if\s+cookiecutter\.(\w+)\s*==\s*'([^']*)'\s*-?%\}(.*?)\{[%]-?\s*endif\s*-?%\}"
)
VARIABLE = re.compile(r"\{\{\s*cookiecutter\.(\w+)\s*\}\}")
# A changelog entry's update line (tools/release.py checks each entry has one).
ACTION_NEEDED = re.compile(r"^Update: action needed\b")
CHANGE_WORDS = {"A": "added", "M": "modified", "D": "removed", "T": "modified"}
# Lines git, copier and cruft write around the two sides of a conflict.
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
MARKER_SCAN_LIMIT = 5 * 1024 * 1024  # bytes
# Hunks `git apply --reject` could not place (cruft's fallback) land in these files.
REJECTED = ".rej"
# What a trial merge of one changed file says (the report's words).
CONFLICTS, CLEAN, UNTRIED = "conflicts", "merges cleanly", "may conflict"
UP_TO_DATE, FAILED, BEHIND, UNRESOLVED, UNLINKED = 0, 1, 3, 4, 5
# Worst first: a table exits with the status of its worst row. UNLINKED: a row of a project
# made with plain cookiecutter, which records no template source (`make template-link`).
SEVERITY = (FAILED, UNRESOLVED, BEHIND, UNLINKED, UP_TO_DATE)
# Each exit status as the summary line under a table counts it.
STANDING = {
    FAILED: "unreadable",
    UNRESOLVED: "with an update not finished",
    BEHIND: "behind",
    UNLINKED: "without a recorded source",
    UP_TO_DATE: "up to date",
}
# A table fits this many columns unless --wide: the longest cells are cut, marked with "…".
TABLE_WIDTH = 100
NARROWEST = 8  # a cell cut narrower than this says too little

Version = tuple[int, int, int]


class StatusError(Exception):
    """A problem that ends the report with one line."""


class NoSourceError(StatusError):
    """No template source recorded: a project made with plain cookiecutter, not linked yet."""


@dataclass
class Change:
    """One project file that differs between two template releases."""

    status: str  # added, modified, removed
    path: str  # relative to the project root
    source: str  # the template's path of it


@dataclass
class Status:
    """Where one project stands; what the text report, the table and --json show."""

    project: str
    engine: str  # copier, cruft or cookiecutter (no answers file)
    template: str
    recorded: str  # the release the project records
    newest: str  # the template's newest release
    newest_ref: str  # its tag, or "HEAD" where the template has no release tags
    behind_by: int  # releases after the recorded one
    changelog: str = ""
    # The releases after the recorded one whose changelog entry says "action needed".
    action_needed: list[str] = field(default_factory=list)
    template_owned: list[Change] = field(default_factory=list)
    project_owned: list[Change] = field(default_factory=list)
    # Files outside the project-owned list that this project changed (None: not in git).
    changed_here: list[str] | None = None
    # Each template-owned file an update changes that was changed here too, and what a trial
    # merge of the two changes says: conflicts, merges cleanly, or may conflict (untried).
    trial_merge: dict[str, str] = field(default_factory=dict)
    conflict_risk: list[str] = field(default_factory=list)  # those that conflict or may
    conflict_markers: list[str] = field(default_factory=list)
    uncommitted: list[str] | None = None  # None: not in git
    last_update: str | None = None  # date of the last commit that changed the record

    @property
    def exit_code(self) -> int:
        """The exit status that CI gates on."""
        if self.conflict_markers:
            return UNRESOLVED
        return BEHIND if self.behind_by else UP_TO_DATE


def _git_bytes(*args: str, cwd: Path | None = None, ok: range = range(1)) -> tuple[int, bytes]:
    """Run git: its exit status (one of ``ok``, else StatusError) and its output."""
    git = shutil.which("git")
    if git is None:
        raise StatusError("git not found on PATH")
    done = subprocess.run([git, *args], cwd=cwd, capture_output=True, check=False)  # noqa: S603
    if done.returncode not in ok:
        stderr = done.stderr.decode("utf-8", "replace").strip()
        raise StatusError(f"git {args[0]}: {(stderr.splitlines() or ['failed'])[-1]}")
    return done.returncode, done.stdout


def _git(*args: str, cwd: Path | None = None) -> str:
    return _git_bytes(*args, cwd=cwd)[1].decode("utf-8")


def _version(text: str, where: str = RECORD) -> Version:
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise StatusError(f"{where}: version {text!r} is not X.Y.Z")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _show(version: Version) -> str:
    return ".".join(map(str, version))


def load_record(root: Path) -> dict[str, Any]:
    """The release record the template wrote into this project."""
    path = root / RECORD
    if not path.is_file():
        raise StatusError(f"{RECORD} not found: run this in a project made by hpc-ml-template")
    try:
        record = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise StatusError(f"{path}: not a readable release record ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("version"), str):
        raise StatusError(f"{path}: damaged release record (no version string)")
    owned, answers = record.get("project_owned"), record.get("answers")
    if not (
        isinstance(owned, list)
        and all(isinstance(pattern, str) for pattern in owned)
        and isinstance(answers, dict)
        and all(isinstance(value, str) for value in answers.values())
    ):
        raise StatusError(f"{path}: damaged release record (project_owned, answers: texts)")
    # Keys with a leading _ are the engines' own settings (_extensions loads code, _copy_...):
    # the template's questions have none, and passing one on would reconfigure the engine.
    if engine_keys := sorted(key for key in answers if key.startswith("_")):
        raise StatusError(
            f"{path}: damaged release record (answers hold the engine setting "
            f"{engine_keys[0]!r}; only the template's questions belong there)"
        )
    _version(record["version"], where=str(path))
    return record


# A top-level line of copier's answers file: a key, then its value (YAML may continue a long
# value or a list on the lines below, indented or starting with "- ").
ANSWER_LINE = re.compile(r"[A-Za-z_][\w-]*:(\s.*)?")


def _yaml_scalar(text: str) -> str:
    """The value of a one-line YAML scalar as copier writes it (plain or quoted)."""
    text = text.strip()
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    if text.startswith('"'):
        value: str = json.loads(text)
        return value
    return text


def _source(source: str, commit: str) -> tuple[str, str]:
    """A recorded template source and commit, checked: git gets neither a blank nor a NUL."""
    if not source.strip() or not source.isprintable():
        raise ValueError(f"the template source {source!r} is no path or URL")
    # copier records a tag or `git describe` (v1.2.0-3-gabc1234), cruft a commit's hash.
    if commit and not re.fullmatch(r"\w[\w.+/-]*", commit):
        raise ValueError(f"the commit {commit[:60]!r} is no git revision")
    return source, commit


def _copier_source(path: Path) -> tuple[str, str]:
    """`_src_path` and `_commit` of copier's answers file, read line by line (no YAML library)."""
    found = {}
    for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip() or line.startswith(("#", " ", "-")):
            continue
        if not ANSWER_LINE.fullmatch(line):  # copier writes one `key: value` a line
            raise ValueError(f"line {number} is not `key: value`: {line[:60]!r}")
        key, _, value = line.partition(":")
        if key in {"_src_path", "_commit"}:
            try:
                found[key] = _yaml_scalar(value)
            except ValueError:
                shown = value.strip()[:60]
                raise ValueError(f"line {number}: {key} {shown!r} is no one-line value") from None
    return _source(found.get("_src_path", ""), found.get("_commit", ""))


def recorded_source(root: Path) -> tuple[str, str, Path] | None:
    """(template source, commit, file) from copier's or cruft's answers file, if there is one."""
    copier, cruft = root / COPIER_ANSWERS, root / CRUFT_STATE
    try:
        if copier.is_file():
            return (*_copier_source(copier), copier)
        if cruft.is_file():
            state = json.loads(cruft.read_text("utf-8"))
            return (*_source(str(state["template"]), str(state.get("commit") or "")), cruft)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StatusError(
            f"{root}: a damaged answers record ({type(exc).__name__}: {exc})"
        ) from None
    return None


def clone_url(source: str) -> str:
    """A URL or path git can clone, from copier's forms too (``gh:``, ``git+file://``)."""
    for short, url in SHORT_HOSTS.items():
        if source.startswith(short):
            return url + source.removeprefix(short)
    return source.removeprefix("git+")  # copier's mark of a git source; git needs the URL


def resolve_local(source: str, root: Path) -> str:
    """A relative template path, as copier records it when given one: from the project first."""
    if "://" in source or ":" in source.partition("/")[0] or Path(source).is_absolute():
        return source
    beside = root / source
    return str(beside.resolve()) if beside.exists() else source


def releases(repo: Path) -> dict[Version, str]:
    """Release tags (vX.Y.Z) of the template repository by version."""
    found = {}
    for tag in _git("tag", "--list", "v*", cwd=repo).split():
        if match := RELEASE_TAG.match(tag):
            found[(int(match[1]), int(match[2]), int(match[3]))] = tag
    return found


def newest_release(repo: Path, tags: dict[Version, str]) -> tuple[Version, str]:
    """The template's newest release and its git ref: what every command reports as newest.

    The highest of the release `tags` (`releases(repo)`); in a template without release tags,
    the version its newest commit states (copier then records that commit), at HEAD, so the
    record and the report still agree.
    """
    if tags:
        newest = max(tags)
        return newest, tags[newest]
    cc = json.loads(_git("show", "HEAD:cookiecutter.json", cwd=repo))
    return _version(cc["_template_version"], where="the template's cookiecutter.json"), "HEAD"


def actions_needed(changelog: str) -> list[str]:
    """The releases among these changelog entries whose update line says "action needed"."""
    found, version = [], ""
    for line in changelog.splitlines():
        if match := CHANGELOG_HEADING.match(line):
            version = ".".join(match.groups())
        elif version and ACTION_NEEDED.match(line):
            found.append(version)
    return found


def changelog_between(text: str, since: Version, upto: Version) -> str:
    """The changelog entries after ``since`` up to and including ``upto``."""
    kept: list[str] = []
    keep = False
    for line in text.splitlines():
        if match := CHANGELOG_HEADING.match(line):
            version = (int(match[1]), int(match[2]), int(match[3]))
            keep = since < version <= upto
        elif line.startswith(("# ", "## ")):  # the title, "## Unreleased"
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
            found.append(Change(CHANGE_WORDS.get(status[:1], "changed"), target, path))
    return sorted(found, key=lambda change: change.path)


def _base_ref(repo: Path, commit: str, version: Version, tags: dict[Version, str]) -> str:
    """The template commit this project was made from: recorded commit, else its tag."""
    for ref in (commit, tags.get(version, "")):
        if ref:
            try:
                return _git("rev-parse", "--verify", "--quiet", f"{ref}^0", cwd=repo).strip()
            except StatusError:
                continue
    raise StatusError(f"release {_show(version)} is not in the template's history")


def git_prefix(root: Path) -> str | None:
    """Where ``root`` lies in its git repository ("" at its top); None when not in git."""
    try:
        return _git("rev-parse", "--show-prefix", cwd=root).strip()
    except StatusError as exc:
        if (root / ".git").exists():  # a repository git cannot read: not "not in git"
            raise StatusError(f"{root / '.git'}: damaged ({exc})") from None
        return None


def uncommitted(root: Path, prefix: str) -> list[str]:
    """The project's files that differ from its last commit, new files included."""
    dirty = _git(
        "status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--", ".",
        cwd=root,
    )  # fmt: skip
    # Porcelain paths are relative to the repository's top, not to the project.
    paths = (entry[3:] for entry in filter(None, dirty.split("\0")))
    return sorted(path.removeprefix(prefix) for path in paths if path.startswith(prefix))


def committed_here(root: Path) -> set[str]:
    """Files this project's own commits changed: all but a generation's or an update's.

    A commit that changes the release record is the template's (the first commit, or an
    update); every other commit is the project's. Edits committed together with an update
    are not seen.
    """
    log = _git("log", "--no-renames", "--format=%x00", "--name-only", "--relative", cwd=root)
    found: set[str] = set()
    for commit in log.split("\0")[1:]:
        files = {line for line in commit.splitlines() if line}
        if RECORD not in files:
            found |= files
    return found


def _merge(ours: bytes, base: bytes, theirs: bytes, folder: Path) -> bytes | None:
    """Merge two changes of ``base`` (git merge-file); None where they conflict."""
    names = []
    for name, content in (("ours", ours), ("base", base), ("theirs", theirs)):
        (folder / name).write_bytes(content)
        names.append(str(folder / name))
    # Its exit status is the number of conflicts (at most 127), negative on an error.
    code, merged = _git_bytes("merge-file", "-p", "-q", *names, ok=range(128))
    return None if code else merged


def _blob(spec: str, cwd: Path) -> bytes | None:
    """A file as a commit has it (``<commit>:<path>``); None where it has no such file."""
    code, content = _git_bytes("show", spec, cwd=cwd, ok=range(256))
    return content if code == 0 else None


def trial_merge(
    old: bytes | None, new: bytes | None, written: bytes | None, current: bytes | None, tmp: Path
) -> str:
    """What taking the template's change of a file this project changed too would do.

    ``old`` and ``new`` are the template's source of the file in the two releases, ``written``
    the file as the template last wrote it here (at the last commit that wrote the release
    record), ``current`` the file as it is now (None: what is not there). copier and cruft
    render both releases with the project's answers and merge the difference into the file.
    Without rendering, the same in two merges: the template's change goes into ``written``,
    which renders it wherever the lines around it hold no answers; that result, as a change of
    ``written``, then meets the project's own change. The first merge failing (answers next to
    the change) or a binary file leaves the outcome untried.
    """
    if old is None or new is None or written is None or current is None:
        return UNTRIED
    if any(b"\0" in content for content in (old, new, written, current)):  # binary
        return UNTRIED
    rendered = _merge(written, old, new, tmp)
    if rendered is None:
        return UNTRIED
    return CLEAN if _merge(current, written, rendered, tmp) is not None else CONFLICTS


def conflict_markers(root: Path) -> list[str]:
    """Files an unfinished update left: with conflict markers, or of rejected hunks."""
    try:
        listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=root)
        files = sorted(set(filter(None, listed.split("\0"))))
    except StatusError:  # not in git: every file but the bookkeeping of tools
        files = sorted(
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not {".git", ".venv", ".conda"} & set(p.relative_to(root).parts)
        )
    found = []
    for rel in files:
        path = root / rel
        if rel.endswith(REJECTED):
            found.append(rel)
            continue
        try:
            if path.stat().st_size > MARKER_SCAN_LIMIT:  # data, not text an update merged
                continue
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):  # binary or unreadable: no markers to find
            continue
        if MARKER.search(text):
            found.append(rel)
    return found


def _last_update(root: Path) -> tuple[str, str] | None:
    """The last commit that wrote the release record (a generation or an update), and its date."""
    try:
        found = _git("log", "-1", "--format=%H %cs", "--", RECORD, cwd=root).split()
    except StatusError:
        return None
    return (found[0], found[1]) if found else None


class Templates:
    """Template clones in one temporary folder, one per source (a fleet shares them)."""

    def __init__(self, folder: Path) -> None:
        """Clone into ``folder``."""
        self.folder = folder
        self.clones: dict[str, Path] = {}

    def get(self, source: str) -> Path:
        """The clone of ``source``, made on first use."""
        if source not in self.clones:
            repo = self.folder / f"template{len(self.clones)}"
            _git("clone", "--quiet", "--no-checkout", clone_url(source), str(repo))
            self.clones[source] = repo
        return self.clones[source]


def project_status(root: Path, template: str | None, templates: Templates) -> Status:
    """Where the project at ``root`` stands against the newest release of its template."""
    record = load_record(root)
    current = _version(record["version"])
    recorded = recorded_source(root)
    source = template or (recorded[0] if recorded else None)
    if not source:
        raise NoSourceError(
            "no template source recorded (no .copier-answers.yml or .cruft.json): "
            "pass TEMPLATE=<template url or path>, or link it with `make template-link`"
        )
    # The recorded commit, where the template has it; else the recorded release's tag.
    commit = recorded[1] if recorded else ""
    try:
        repo = templates.get(resolve_local(source, root))
    except StatusError as exc:
        if template or not recorded:
            raise
        raise StatusError(f"{exc} (the template source recorded in {recorded[2]})") from None
    tags = releases(repo)
    newest, newest_ref = newest_release(repo, tags)
    behind_by = sum(1 for version in tags if version > current) if tags else int(newest > current)
    last = _last_update(root)
    status = Status(
        project=str(root),
        engine=ENGINES[recorded[2].name] if recorded else "cookiecutter",
        template=source,
        recorded=_show(current),
        newest=_show(newest),
        newest_ref=newest_ref,
        behind_by=behind_by,
        conflict_markers=conflict_markers(root),
        last_update=last[1] if last else None,
    )
    prefix = git_prefix(root)
    owned = record["project_owned"]
    if prefix is not None:
        status.uncommitted = uncommitted(root, prefix)
        mine = committed_here(root) | set(status.uncommitted)
        status.changed_here = sorted(
            path for path in mine if not is_project_owned(path, owned) and path != RECORD
        )
    if not behind_by:
        return status
    changelog = _git("show", f"{newest_ref}:CHANGELOG.md", cwd=repo)
    status.changelog = changelog_between(changelog, current, newest)
    status.action_needed = actions_needed(status.changelog)
    base = _base_ref(repo, commit, current, tags)
    touched = changes(repo, base, newest_ref, record["answers"])
    status.template_owned = [c for c in touched if not is_project_owned(c.path, owned)]
    status.project_owned = [c for c in touched if is_project_owned(c.path, owned)]
    edited = set(status.changed_here or [])
    for change in status.template_owned:
        if change.path not in edited:
            continue
        here = root / change.path
        status.trial_merge[change.path] = trial_merge(
            _blob(f"{base}:{change.source}", repo),
            _blob(f"{newest_ref}:{change.source}", repo),
            _blob(f"{last[0]}:./{change.path}", root) if last else None,
            here.read_bytes() if change.status == "modified" and here.is_file() else None,
            templates.folder,
        )
    status.conflict_risk = [path for path, said in status.trial_merge.items() if said != CLEAN]
    return status


def _listing(changes: list[Change]) -> list[str]:
    return [f"  {c.status:<9} {c.path}" for c in changes] or ["  (none)"]


def render(status: Status) -> str:
    """The report of one project as text."""
    recorded = _version(status.recorded)
    lines = [
        f"This project: hpc-ml-template {status.recorded}",
        f"Template: {status.template}",
        f"Newest release: {status.newest} ({status.newest_ref})",
    ]
    if not status.behind_by:
        lines.append(f"Up to date: no release after {status.recorded}.")
    else:
        lines += [
            "",
            f"Changes since {_show(recorded)} (CHANGELOG.md):",
            "",
            status.changelog or "(none)",
            "",
        ]
        lines.append(
            f"An update would change these template-owned files ({len(status.template_owned)}):"
        )
        lines += _listing(status.template_owned)
        lines.append(
            f"It leaves these alone, as this project owns them ({len(status.project_owned)}):"
        )
        lines += _listing(status.project_owned)
        if status.changed_here is None:
            lines.append("Changed here too (conflict risk): unknown, this project is not in git.")
        else:
            trial = status.trial_merge
            lines.append(f"Changed here too, merged with the update on trial ({len(trial)}):")
            lines += [f"  {said:<14}  {path}" for path, said in trial.items()] or ["  (none)"]
        if status.action_needed:
            needed = ", ".join(status.action_needed)
            lines.append(f"Action needed (see the changelog entries above): {needed}")
        checkout = f" --checkout {status.newest_ref}" if status.newest_ref != "HEAD" else ""
        lines += [
            "",
            "A file is listed when its template source changed; a change inside a part your",
            "answers leave out shows here but changes nothing. Commit your work, then take the",
            f"release with `make update` (`copier update --trust` or `cruft update{checkout}`).",
        ]
    if status.conflict_markers:
        lines += ["", "Conflicts left by an update (resolve them, then commit):"]
        lines += [f"  {path}" for path in status.conflict_markers]
    return "\n".join(lines)


def read_repos(names: list[str], files: list[str]) -> list[str]:
    """Repository paths or URLs from the arguments and from list files (# comments)."""
    repos = list(names)
    for name in files:
        try:
            text = Path(name).read_text("utf-8")
        except OSError as exc:
            raise StatusError(f"--repos-file {name}: {exc.strerror}") from exc
        for line in text.splitlines():
            entry = line.split("#", 1)[0].strip()
            if entry:
                repos.append(entry)
    return repos


def fleet_row(repo: str, template: str | None, templates: Templates) -> dict[str, Any]:
    """One repository's row of the table: a local path, or a git URL cloned for the look."""
    row: dict[str, Any] = {"repo": repo}
    try:
        root = Path(repo).expanduser()
        if not root.is_dir():
            root = templates.folder / f"repo{len(list(templates.folder.glob('repo*')))}"
            _git("clone", "--quiet", clone_url(repo), str(root))
        status = project_status(root, template, templates)
    except NoSourceError:  # plain cookiecutter: its release is known, the newest is not
        recorded = load_record(root)["version"]
        note = "no recorded source: make template-link"
        return {**row, "engine": "cookiecutter", "recorded": recorded, "note": note,
                "exit_code": UNLINKED}  # fmt: skip
    except StatusError as exc:
        return {**row, "error": str(exc), "exit_code": FAILED}
    return {
        **row,
        "engine": status.engine,
        "recorded": status.recorded,
        "newest": status.newest,
        "behind_by": status.behind_by,
        "action_needed": status.action_needed,
        "conflict_risk": status.conflict_risk,
        "changed_here": status.changed_here,
        "conflict_markers": status.conflict_markers,
        "uncommitted": status.uncommitted,
        "last_update": status.last_update,
        "exit_code": status.exit_code,
    }


def render_table(rows: list[dict[str, Any]], width: int | None = TABLE_WIDTH) -> str:
    """The fleet as a text table, one row per repository, within `width` columns (None: all).

    A row that cannot be read, or has no recorded source, says so after its first columns,
    wrapped onto the next lines where it is longer than the line. Where the table is still
    wider, the widest columns give way (a repository path keeps its end) and a line says so.
    """
    header = [
        "repo", "engine", "recorded", "newest", "behind", "action", "uncommitted",
        "conflict risk", "last update",
    ]  # fmt: skip
    table, said = [header], {}
    for row in rows:
        if "error" in row or "note" in row:
            said[len(table)] = f"error: {row['error']}" if "error" in row else row["note"]
            table.append([row["repo"], row.get("engine", "?"), row.get("recorded", "?")])
            continue
        risk = ", ".join(row["conflict_risk"]) or "-"
        dirty = "?" if row["uncommitted"] is None else str(len(row["uncommitted"]))
        if row["changed_here"] is None:
            risk = "? (not in git)"
        if row["conflict_markers"]:
            risk = f"left: {', '.join(row['conflict_markers'])}"
        table.append([
            row["repo"], row["engine"], row["recorded"], row["newest"], str(row["behind_by"]),
            ", ".join(row["action_needed"]) or "-", dirty, risk, row["last_update"] or "-",
        ])  # fmt: skip
    whole = [max(len(line[i]) for line in table if i < len(line)) for i in range(len(header))]
    widths = fitted(whole, width, [max(NARROWEST, len(name)) for name in header])
    span = sum(widths[:3]) + 2 * 3  # where a row's message starts
    lines = []
    for at, line in enumerate(table):
        pairs = enumerate(zip(line, widths, strict=False))  # a message row: its first three
        cells = [cut(cell, w, left=i == 0).ljust(w) for i, (cell, w) in pairs]
        if at not in said:
            lines.append("  ".join(cells).rstrip())
            continue
        room = max(width - span, 20) if width else len(said[at])
        wrapped = textwrap.wrap(said[at], room, break_on_hyphens=False) or [""]
        lines.append("  ".join(cells) + "  " + wrapped[0])
        lines += [" " * span + more for more in wrapped[1:]]
    if widths != whole:
        lines.append(f"(… marks a cell cut to {width} columns: --wide or WIDE=1 shows it whole)")
    lines.append(summary([row["exit_code"] for row in rows]))
    return "\n".join(lines)


def summary(codes: list[int]) -> str:
    """The table's last line: how many repositories, and how many stand where (worst first)."""
    counts = [f"{codes.count(code)} {STANDING[code]}" for code in SEVERITY if code in codes]
    noun = "repository" if len(codes) == 1 else "repositories"
    return f"{len(codes)} {noun}: {', '.join(counts) or 'none'}"


def fitted(widths: list[int], limit: int | None, floors: list[int]) -> list[int]:
    """Column widths whose line (two spaces between) fits `limit`: the widest give way first.

    None goes below its floor: the names of the columns stay whole.
    """
    widths = list(widths)
    while limit is not None and sum(widths) + 2 * (len(widths) - 1) > limit:
        wider = [i for i, floor in enumerate(floors) if widths[i] > floor]
        if not wider:
            break
        widths[max(wider, key=widths.__getitem__)] -= 1
    return widths


def cut(cell: str, width: int, *, left: bool = False) -> str:
    """`cell` within `width`, marked with "…" where cut (a repository path: at its start)."""
    if len(cell) <= width:
        return cell
    return "…" + cell[len(cell) - width + 1 :] if left else cell[: width - 1] + "…"


def worst(codes: list[int]) -> int:
    """The exit status of a table: that of its worst row."""
    return next((code for code in SEVERITY if code in codes), UP_TO_DATE)


def main(argv: list[str] | None = None) -> int:
    """Print the status of the project in the current folder, or a table of repositories."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="exit status: 0 up to date, 1 error, 3 behind, 4 conflicts left by an update, "
        "5 (a table) a project without a recorded source (make template-link)",
    )
    parser.add_argument("repos", nargs="*", help="repositories (paths or git URLs): a table")
    parser.add_argument("--repos-file", action="append", default=[], metavar="FILE",
                        help="a file with one repository path or git URL per line")  # fmt: skip
    parser.add_argument("--template", help="template URL or path (default: the recorded one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    whole = f"a table with every cell whole (default: {TABLE_WIDTH} columns)"
    parser.add_argument("--wide", action="store_true", help=whole)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="template-status-") as tmp:
        templates = Templates(Path(tmp))
        try:
            repos = read_repos(args.repos, args.repos_file)
            if not repos:
                status = project_status(Path.cwd(), args.template or None, templates)
                print(json.dumps(asdict(status), indent=2) if args.json else render(status))
                return status.exit_code
        except StatusError as exc:
            print(f"template-status: {exc}", file=sys.stderr)
            return FAILED
        rows = [fleet_row(repo, args.template or None, templates) for repo in repos]
    code = worst([row["exit_code"] for row in rows])
    print(
        json.dumps({"repos": rows, "exit_code": code}, indent=2)
        if args.json
        else render_table(rows, None if args.wide else TABLE_WIDTH)
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
