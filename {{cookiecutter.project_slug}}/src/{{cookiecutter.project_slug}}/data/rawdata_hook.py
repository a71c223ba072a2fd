"""Pre-commit hook: raw data changes only together with a manifest that matches them.

A commit that adds, changes or deletes anything below the raw folder, or changes the
manifest, passes only if

1. the manifest is part of the same commit,
2. every raw file tracked by git is recorded in the staged manifest with the staged content,
3. the content of the raw folder on disk (tracked or git-ignored files alike) matches the
   staged manifest, which is exactly what ``data freeze --update`` leaves behind.

Permissions are not checked here: git does not commit them, and a fresh clone or ``git
init`` has writable files that are still the recorded data (``data freeze`` fixes them).

The hook reads the staged changes from git itself (``always_run``, no file names), because
pre-commit leaves deleted files out of the names it passes to hooks.
pre-commit runs it as ``python -m <package>.rawdata_hook`` with ``src`` on the path; it
needs only tqdm and python-dotenv besides the standard library (see .pre-commit-config.yaml).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

from .manifest import PROGRAM, RawDataError, parse_manifest
from .rawdata import IGNORED_NAMES, MANIFEST_PATH, PERMISSIONS, compare, default_paths

_SHOWN = 10  # problems listed before "and N more"


def _git_exe() -> str:
    git = shutil.which("git")
    if git is None:
        raise RawDataError("git is not on PATH")
    return git


def _git(*args: str) -> str:
    command = [_git_exe(), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        raise RawDataError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _blob_digest(oid: str) -> tuple[int, str]:
    """Size and SHA-256 of a staged blob, streamed from git in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    command = [_git_exe(), "cat-file", "blob", oid]
    with subprocess.Popen(command, stdout=subprocess.PIPE) as proc:  # noqa: S603
        assert proc.stdout is not None
        while chunk := proc.stdout.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    if proc.returncode != 0:
        raise RawDataError(f"git cat-file blob {oid} failed")
    return size, digest.hexdigest()


def _repo_path(path: Path, top: Path) -> str | None:
    """``path`` relative to the repository as git writes it, or None if it lies outside."""
    try:
        return path.resolve().relative_to(top).as_posix()
    except ValueError:
        return None


def _is_data(path: str, raw_prefix: str | None) -> bool:
    inside = raw_prefix is not None and path.startswith(raw_prefix + "/")
    return inside and PurePosixPath(path).name not in IGNORED_NAMES


def check_staged() -> list[str]:
    """Problems with the staged raw data and manifest, one line each; empty means commit."""
    raw_dir, manifest = default_paths()
    top = Path(_git("rev-parse", "--show-toplevel").strip()).resolve()
    raw_prefix = _repo_path(raw_dir, top)
    manifest_path = _repo_path(manifest, top) or MANIFEST_PATH.as_posix()
    staged = _git("diff", "--cached", "--name-only", "--no-renames", "-z").split("\0")
    raw_staged = sorted(path for path in staged if _is_data(path, raw_prefix))
    if manifest_path not in staged:
        if not raw_staged:
            return []
        return [f"{path} is staged but {manifest_path} is not" for path in raw_staged]
    try:
        text = _git("show", f":{manifest_path}")
    except RawDataError:
        return [f"{manifest_path} is staged for deletion; the raw data needs its manifest"]
    expected = parse_manifest(text, f"{manifest_path} (staged)")
    problems = []
    if raw_prefix is not None:
        listing = _git("ls-files", "--stage", "-z", "--", raw_prefix).split("\0")
        for line in filter(None, listing):
            info, path = line.split("\t", 1)
            if not _is_data(path, raw_prefix):
                continue
            rel = path[len(raw_prefix) + 1 :]
            entry = expected.get(rel)
            size, sha256 = _blob_digest(info.split()[1])
            if entry is None:
                problems.append(f"{path} is staged but not recorded in {manifest_path}")
            elif (size, sha256) != (entry.size, entry.sha256):
                problems.append(f"{path}: staged content differs from {manifest_path}")
    problems.extend(
        f"{change.describe(raw_dir)} (against the staged {manifest_path})"
        for change in compare(raw_dir, expected)
        if change.kind != PERMISSIONS
    )
    return problems


def main() -> int:
    """Run the check; print what is wrong and how to fix it, exit 1 if anything is."""
    try:
        problems = check_staged()
    except RawDataError as error:
        problems = [str(error)]
    if not problems:
        return 0
    print("raw data and manifest must change together:")
    for problem in problems[:_SHOWN]:
        print(f"  {problem}")
    if len(problems) > _SHOWN:
        print(f"  ... and {len(problems) - _SHOWN} more")
    manifest = MANIFEST_PATH.as_posix()
    print(f"If intended: `{PROGRAM} data freeze --update` and `git add {manifest}`.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
