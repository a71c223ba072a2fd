"""Take a template release into this project (`make update`), or link it (`make template-link`).

`make update` runs the engine the project was made with (copier or cruft) to the newest
release (or ``--ref``) and then checks what the update left: copier and cruft both exit 0
after writing conflict markers or rejected hunks (``.rej``), so this exits 4 and names the
files instead. It refuses to start on uncommitted work, which an update would mix with its
own changes, or on the conflicts of an update not finished.

`make template-link` links a project made with plain cookiecutter to its template with cruft,
from the release and the answers the project records, so cruft asks no question again.

Standard library and git only, like ``template_status.py``, whose look at the project it uses.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from template_status import (
    CRUFT_STATE,
    FAILED,
    UNRESOLVED,
    UP_TO_DATE,
    Status,
    StatusError,
    Templates,
    _git_bytes,
    _show,
    conflict_markers,
    load_record,
    newest_release,
    project_status,
    recorded_source,
    releases,
    resolve_local,
)


def _engine(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise StatusError(f"{name} not found on PATH: install it (`pipx install {name}`)")
    return found


def _ready(status: Status) -> None:
    """Refuse an update that would mix with work or conflicts already here."""
    if status.conflict_markers:
        raise StatusError(
            f"an update is not finished: resolve {', '.join(status.conflict_markers)}, then commit"
        )
    if status.uncommitted is None:
        raise StatusError("this project is not in git: `git init`, commit, then update")
    if status.uncommitted:
        shown = ", ".join(status.uncommitted[:3]) + (", ..." if len(status.uncommitted) > 3 else "")
        raise StatusError(
            f"commit your work first (not committed: {shown}); the update's changes are then "
            "the only ones to review"
        )


def run_engine(command: list[str], root: Path, what: str) -> None:
    """Run an engine's CLI; its messages pass through, a failure ends in one line.

    The engine's error output is held back while it runs: on success it is shown as it was,
    on failure (a traceback of 50 lines and more) its last line is said, and the whole of it
    is kept in a log file that the line names.
    """
    print("+", Path(command[0]).name, *command[1:])
    done = subprocess.run(command, cwd=root, check=False, stderr=subprocess.PIPE, text=True)  # noqa: S603  (the engine's CLI)
    if done.returncode == 0:
        sys.stderr.write(done.stderr)
        return
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    with tempfile.NamedTemporaryFile(
        "w", prefix="template-update-", suffix=".log", delete=False, encoding="utf-8"
    ) as log:
        log.write(done.stderr)
    last = lines[-1] if lines else "no message"
    raise StatusError(
        f"{what} failed (exit status {done.returncode}): {last} (its whole output: {log.name})"
    )


def check_ref(repo: Path, ref: str, source: str) -> None:
    """Refuse a ``ref`` the template does not have, naming its newest release.

    The newest release is the one `make template-status` names (``newest_release``); the
    release tags before it follow.
    """
    missing, _ = _git_bytes("rev-parse", "--verify", "--quiet", ref + "^{commit}", cwd=repo,
                            ok=range(2))  # fmt: skip
    if missing:
        tags = releases(repo)
        version, at = newest_release(repo, tags)
        older = [tag for _, tag in sorted(tags.items(), reverse=True)][1:5]
        before = f"; before it: {', '.join(older)}" if older else ""
        raise StatusError(
            f"REF={ref}: the template {source} has no such release (newest release: "
            f"{_show(version)} ({at}){before})"
        )


def update_command(status: Status, ref: str) -> list[str]:
    """The engine's command that takes the release ``ref``."""
    if status.engine == "copier":
        command = [_engine("copier"), "update", "--trust", f"--vcs-ref={ref}"]
        # New questions take their defaults where nobody can answer them (CI, a pipe).
        return command + ([] if sys.stdin.isatty() else ["--defaults"])
    command = [_engine("cruft"), "update", "--skip-apply-ask"]
    return command + ([] if ref == "HEAD" else ["--checkout", ref])  # no --checkout: HEAD


def update(root: Path, ref: str | None) -> int:
    """Take the release ``ref`` (default: the newest); the exit status of `make update`."""
    recorded = recorded_source(root)
    if recorded is None:
        load_record(root)  # a project of this template at all?
        raise StatusError(
            "made with plain cookiecutter, which cannot update: link the project once with "
            "`make template-link TEMPLATE=<template url>`, commit .cruft.json, then update"
        )
    with tempfile.TemporaryDirectory(prefix="template-update-") as tmp:
        templates = Templates(Path(tmp))
        status = project_status(root, None, templates)
        if ref is not None:  # the clone project_status made (Templates keeps one a source)
            check_ref(templates.get(resolve_local(recorded[0], root)), ref, recorded[0])
    _ready(status)
    if ref is None and not status.behind_by:
        print(f"Up to date: no release after {status.recorded}.")
        return UP_TO_DATE
    target = ref or status.newest_ref
    run_engine(update_command(status, target), root, f"{status.engine} update")
    left = conflict_markers(root)
    if left:  # the engine may have said "clean" just before: the last line says what is
        listing = "\n".join(["Conflicts left by the update:", *(f"  {path}" for path in left)])
        print(listing, flush=True)
        print(
            f"make update: the update to {target} left conflicts in {len(left)} files (above: "
            "conflict markers, or rejected hunks in .rej files): resolve them, delete the .rej "
            "files, then commit",
            file=sys.stderr,
        )
        return UNRESOLVED
    print(f"Updated to {target}: review with `git status` and `git diff HEAD`, then commit.")
    return UP_TO_DATE


def link(root: Path, template: str) -> int:
    """Link a plain cookiecutter project to ``template`` with cruft, from its record."""
    record = load_record(root)
    if (found := recorded_source(root)) is not None:
        raise StatusError(f"already linked to {found[0]} ({found[2].name})")
    command = [_engine("cruft"), "link", "--no-input", "--checkout", f"v{record['version']}"]
    command += ["--extra-context", json.dumps(record["answers"]), template]
    run_engine(command, root, "cruft link")
    if not (root / CRUFT_STATE).is_file():
        raise StatusError(f"cruft link wrote no {CRUFT_STATE}")
    print(
        f"Linked to {template} at v{record['version']}: commit {CRUFT_STATE}; then `make update`."
    )
    return UP_TO_DATE


def main(argv: list[str] | None = None) -> int:
    """`make update` or `make template-link`, in the project in the current folder."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="exit status: 0 done, 1 error or refused, 4 conflicts left by the update",
    )
    parser.add_argument("--ref", help="the release tag (or commit) to take; default: newest")
    parser.add_argument("--link", metavar="TEMPLATE", help="link to this template URL or path")
    args = parser.parse_args(argv)
    try:
        if args.link is not None:
            if not args.link:
                raise StatusError("which template? `make template-link TEMPLATE=<template url>`")
            return link(Path.cwd(), args.link)
        return update(Path.cwd(), args.ref)
    except StatusError as exc:
        print(f"make {'update' if args.link is None else 'template-link'}: {exc}", file=sys.stderr)
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
