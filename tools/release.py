"""Release the template: check that the version is ready, tag it, publish the tag.

The version is ``_template_version`` in ``cookiecutter.json`` (its one source; ``make sync``
mirrors it into copier.yml). ``make release`` runs ``check``, the tests (``TESTS=all``, the
default, ``quick`` or ``none``) and ``tag``; ``make publish`` runs ``publish``. Standard
library only, besides the mirror checks it runs (tools/*.py ``--check``, which need the
template's .venv).

``check`` fails, with one line, unless the version is X.Y.Z, newer than every release tag
and not tagged yet, CHANGELOG.md has its entry (``## X.Y.Z — YYYY-MM-DD``, the dash may be
hyphen, en or em dash, then an ``Update:`` line saying whether projects must act, then at
least one ``- `` item), the generated mirrors (copier.yml, the hook's data, the options
page) are up to date and the working tree is clean (the tag must name exactly what was
tested). ``publish`` pushes the tag and checks that the remote, the repository users copy
from, has a tag on the right commit for every release in CHANGELOG.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
# Hyphen-minus, en dash, em dash: what people type between version and date.
DASHES = "-\u2013\u2014"
AFTER_VERSION = 2  # a dash and the date
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
ANY_RELEASE_HEADING = re.compile(r"^## (\d+\.\d+\.\d+) ")
# Each prints "stale: ..." and exits 1 when what it writes differs from the committed file.
MIRRORS = ("tools/sync_questions.py", "tools/gen_hook_data.py", "tools/gen_options_doc.py")
TESTED = ("all", "quick", "none")
SHOWN = 5  # uncommitted files a refusal names; the rest are counted

Version = tuple[int, ...]


class ReleaseError(Exception):
    """Why the release cannot be made, in one line."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise ReleaseError(f"git {args[0]}: {last}")
    return done.stdout


def template_version(root: Path = ROOT) -> str:
    """The version in cookiecutter.json."""
    version = json.loads((root / "cookiecutter.json").read_text("utf-8"))["_template_version"]
    if not VERSION.match(version):
        raise ReleaseError(f"cookiecutter.json: _template_version {version!r} is not X.Y.Z")
    return version


def heading_problem(line: str, version: str) -> str:  # noqa: PLR0911 (one answer a part)
    """What makes a heading that names the version differ from '## X.Y.Z — YYYY-MM-DD'."""
    if not line.startswith("## "):
        return "it must start with '## ' (two '#' and a space)"
    rest = line[3:]
    if rest.startswith("v"):
        return "no 'v' before the version"
    if not rest.startswith(version):
        return f"the version must follow '## ' directly, as {version}"
    tail = rest[len(version) :]
    parts = tail.split()
    if not parts:
        return "the date is missing"
    if parts[0] not in DASHES:
        return f"a dash ({', '.join(DASHES)}) between version and date, found {parts[0]!r}"
    if len(parts) < AFTER_VERSION:
        return "the date is missing after the dash"
    if len(parts) > AFTER_VERSION or not DATE.match(parts[1]):
        return f"the date must be YYYY-MM-DD and end the line, found {' '.join(parts[1:])!r}"
    return "one space either side of the dash"


def changelog_entry(text: str, version: str) -> list[str]:
    """The lines of the version's changelog entry, checked for its required parts."""
    lines = text.splitlines()
    heading = re.compile(rf"^## {re.escape(version)} [{DASHES}] \d{{4}}-\d{{2}}-\d{{2}}$")
    starts = [i for i, line in enumerate(lines) if heading.match(line)]
    if not starts:
        near = re.compile(rf"^#+\s*v?{re.escape(version)}(\s|$)")
        for line in lines:
            if near.match(line):
                problem = heading_problem(line, version)
                raise ReleaseError(
                    f"CHANGELOG.md: heading {line!r} is not '## {version} — YYYY-MM-DD': {problem}"
                )
        raise ReleaseError(
            f"CHANGELOG.md: no entry '## {version} — YYYY-MM-DD' "
            "(the dash may also be a hyphen or an en dash)"
        )
    end = next(
        (i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
    )
    body = [line for line in lines[starts[0] + 1 : end] if line.strip()]
    problems = []
    if not body or not body[0].startswith("Update: "):
        problems.append(f"CHANGELOG.md: the {version} entry must start with an 'Update:' line")
    if not any(line.startswith("- ") for line in body):
        problems.append(f"CHANGELOG.md: the {version} entry lists no change ('- ...')")
    if problems:
        raise ReleaseError("\n".join(problems))
    return body


def stale_mirrors() -> list[str]:
    """What the mirror generators report as stale (they run with this Python)."""
    stale = []
    for tool in MIRRORS:
        done = subprocess.run(
            [sys.executable, tool, "--check"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        if "ModuleNotFoundError" in done.stderr:
            missing = done.stderr.strip().splitlines()[-1]
            raise ReleaseError(
                f"{tool} --check cannot run with {sys.executable} ({missing}): "
                "run `make sync` once (it makes .venv), then `make release` again"
            )
        if done.returncode != 0:
            stale += [line for line in done.stderr.splitlines() if line.strip()] or [tool]
    return stale


def _released() -> set[Version]:
    return {
        tuple(int(n) for n in m.groups())
        for m in map(TAG.match, _git("tag", "--list", "v*").split())
        if m
    }


def check() -> str:
    """Return the version when it can be released; raise ReleaseError otherwise.

    Every rule is checked, and the error names each one that fails (a line each), so one run
    says all that stands between the tree and its release.
    """
    version = template_version()  # the other rules need it
    problems: list[str] = []
    for rule in (_entry_written, _not_released, _mirrors_fresh, _tree_clean):
        try:
            rule(version)
        except ReleaseError as exc:
            problems += str(exc).splitlines()
    if problems:
        raise ReleaseError("\n".join(problems))
    return version


def _entry_written(version: str) -> None:
    changelog_entry((ROOT / "CHANGELOG.md").read_text("utf-8"), version)


def _not_released(version: str) -> None:
    released = _released()
    wanted = tuple(int(n) for n in version.split("."))
    if wanted in released:
        raise ReleaseError(f"v{version} is tagged already: raise _template_version first")
    if released and wanted < max(released):
        newest = ".".join(map(str, max(released)))
        raise ReleaseError(f"{version} is older than the newest release {newest}")


def _mirrors_fresh(_version: str) -> None:
    # A tag on stale mirrors records the old version for copier and the new one for
    # cookiecutter: its projects would report themselves behind for good.
    if stale := stale_mirrors():
        raise ReleaseError(f"{'; '.join(stale)}; commit the result")


def _tree_clean(_version: str) -> None:
    # Every file by its path (a new folder's files too, not the folder), the first few named.
    status = _git("status", "--porcelain", "-z", "--no-renames", "--untracked-files=all")
    entries = [entry for entry in status.split("\0") if entry]
    if entries:
        named = [f"{e[3:]} (untracked)" if e.startswith("??") else e[3:] for e in entries]
        more = f" and {len(named) - SHOWN} more" if len(named) > SHOWN else ""
        files = f"{len(named)} file{'s' if len(named) > 1 else ''}"
        raise ReleaseError(
            f"uncommitted changes: commit them first ({files}: {', '.join(named[:SHOWN])}{more})"
        )


def publish(remote: str) -> str:
    """Push the version's tag to ``remote``; check it has every release's tag, right commit."""
    version = template_version()
    tag = f"v{version}"
    try:
        _git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}")
    except ReleaseError:
        raise ReleaseError(f"{tag} is not tagged yet: run `make release` first") from None
    changelog = (ROOT / "CHANGELOG.md").read_text("utf-8").splitlines()
    listed = [m[1] for m in map(ANY_RELEASE_HEADING.match, changelog) if m]
    wanted = [
        v for v in listed if tuple(map(int, v.split("."))) <= tuple(map(int, version.split(".")))
    ]
    # Every release tag this clone has goes along: a remote made from a mirror or a fresh
    # import arrives without them, and copier then takes its newest commit for a release.
    here = set(_git("tag", "--list", "v*").split())
    _git("push", "--quiet", remote, *(f"refs/tags/v{v}" for v in wanted if f"v{v}" in here))
    there = {}
    for line in _git("ls-remote", "--tags", remote).splitlines():
        sha, ref = line.split("\t")
        if ref.endswith("^{}"):  # the commit an annotated tag points to
            there[ref.removeprefix("refs/tags/").removesuffix("^{}")] = sha
        else:
            there.setdefault(ref.removeprefix("refs/tags/"), sha)
    missing = [v for v in wanted if f"v{v}" not in there]
    if missing:
        commands = " && ".join(f"git tag -a v{v} {_release_commit(v)} -m v{v}" for v in missing)
        raise ReleaseError(
            f"{remote} lacks the tags of releases in CHANGELOG.md: "
            f"{', '.join(f'v{v}' for v in missing)}, and so does this clone: tag each "
            f"release's commit, then run `make publish` again: {commands}"
        )
    local = _git("rev-parse", f"{tag}^{{commit}}").strip()
    if there[tag] != local:
        raise ReleaseError(f"{remote} has {tag} on {there[tag][:12]}, here it is {local[:12]}")
    return version


def _release_commit(version: str) -> str:
    """The commit that made ``version`` the template's version, or ``<commit>`` if none did."""
    found = _git(
        "log", "--format=%h", "-S", f'"_template_version": "{version}"', "--", "cookiecutter.json"
    ).split()
    return found[-1] if found else "<commit>"  # the oldest: where the version was set


def main(argv: list[str] | None = None) -> int:
    """Run ``check``, ``tag`` or ``publish``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["check", "tag", "publish"])
    parser.add_argument("--tested", choices=TESTED, default="all", help="recorded in the tag")
    parser.add_argument("--remote", default="origin", help="where `publish` pushes")
    args = parser.parse_args(argv)
    try:
        if args.step == "publish":
            version = publish(args.remote)
            print(f"release: published v{version}: {args.remote} has every release's tag")
            return 0
        version = check()
        if args.step == "tag":
            message = f"hpc-ml-template {version} (tests: {args.tested})"
            _git("tag", "-a", f"v{version}", "-m", message)
    except ReleaseError as exc:
        for problem in str(exc).splitlines():
            print(f"release: {problem}", file=sys.stderr)
        return 1
    if args.step == "check":
        print(f"release: {version} is ready (CHANGELOG.md entry, mirrors, clean tree, not tagged)")
    else:
        print(
            f"release: tagged v{version} (tests: {args.tested}); "
            f"publish it with `make publish` (pushes v{version} to origin and checks the tags)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
