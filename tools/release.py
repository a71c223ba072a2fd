"""Release the template: check that the version is ready, then tag it.

The version is ``_template_version`` in ``cookiecutter.json`` (its one source; ``make sync``
mirrors it into copier.yml). ``make release`` runs ``check``, the test suite (skipped with
``SKIP_TESTS=1``) and ``tag``. Standard library only: it runs with any python3.

``check`` fails, with one line, unless the version is X.Y.Z, newer than every release tag
and not tagged yet, CHANGELOG.md has its entry (``## X.Y.Z — YYYY-MM-DD``, then an
``Update:`` line saying whether projects must act, then at least one ``- `` item) and the
working tree is clean (the tag must name exactly what was tested).
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


class ReleaseError(Exception):
    """Why the release cannot be made, in one line."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"git {args[0]}: {done.stderr.strip()}")
    return done.stdout


def template_version(root: Path = ROOT) -> str:
    """The version in cookiecutter.json."""
    version = json.loads((root / "cookiecutter.json").read_text("utf-8"))["_template_version"]
    if not VERSION.match(version):
        raise ReleaseError(f"cookiecutter.json: _template_version {version!r} is not X.Y.Z")
    return version


def changelog_entry(text: str, version: str) -> list[str]:
    """The lines of the version's changelog entry, checked for its required parts."""
    lines = text.splitlines()
    heading = re.compile(rf"^## {re.escape(version)} — \d{{4}}-\d{{2}}-\d{{2}}$")
    starts = [i for i, line in enumerate(lines) if heading.match(line)]
    if not starts:
        raise ReleaseError(f"CHANGELOG.md: no entry '## {version} — YYYY-MM-DD'")
    end = next(
        (i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
    )
    body = [line for line in lines[starts[0] + 1 : end] if line.strip()]
    if not body or not body[0].startswith("Update: "):
        raise ReleaseError(f"CHANGELOG.md: the {version} entry must start with an 'Update:' line")
    if not any(line.startswith("- ") for line in body):
        raise ReleaseError(f"CHANGELOG.md: the {version} entry lists no change ('- ...')")
    return body


def check() -> str:
    """Return the version when it can be released; raise ReleaseError otherwise."""
    version = template_version()
    changelog_entry((ROOT / "CHANGELOG.md").read_text("utf-8"), version)
    released = {
        tuple(int(n) for n in m.groups())
        for m in map(TAG.match, _git("tag", "--list", "v*").split())
        if m
    }
    wanted = tuple(int(n) for n in version.split("."))
    if wanted in released:
        raise ReleaseError(f"v{version} is tagged already: raise _template_version first")
    if released and wanted < max(released):
        newest = ".".join(map(str, max(released)))
        raise ReleaseError(f"{version} is older than the newest release {newest}")
    if dirty := _git("status", "--porcelain").strip():
        raise ReleaseError(f"uncommitted changes: commit them first ({dirty.splitlines()[0]})")
    return version


def main(argv: list[str] | None = None) -> int:
    """Run ``check`` or ``tag``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["check", "tag"])
    args = parser.parse_args(argv)
    try:
        version = check()
        if args.step == "tag":
            _git("tag", "-a", f"v{version}", "-m", f"hpc-ml-template {version}")
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    if args.step == "check":
        print(f"release: {version} is ready (CHANGELOG.md entry, clean tree, not tagged yet)")
    else:
        print(f"release: tagged v{version}; publish it with `git push origin v{version}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
