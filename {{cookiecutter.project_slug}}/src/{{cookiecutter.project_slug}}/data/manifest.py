"""The raw-data manifest file: one tab-separated line per raw file.

The manifest is committed to git, so it is plain text that diffs well: a header row, then
``path  size  mode  sha256`` per file, sorted by path. Paths are POSIX paths relative to the
raw-data folder; ``mode`` is the octal permission set that ``data freeze`` left on the file.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping

# The command users type: the package, whatever wing this module sits in.
PROGRAM = (__package__ or "").partition(".")[0]
HEADER = ("path", "size", "mode", "sha256")
# One regular expression per line keeps reading 100,000 entries well under a second.
_LINE = re.compile(r"([^\t]+)\t([0-9]+)\t(0[0-7]{3,4})\t([0-9a-f]{64})")


class RawDataError(Exception):
    """Raw data and manifest disagree, or one of them cannot be read (one-line message)."""


class Entry(NamedTuple):
    """What the manifest records about one raw file (a tuple: cheap for 100,000 files)."""

    size: int
    mode: int
    sha256: str


def check_path(rel: str) -> None:
    """Reject a relative path that one manifest line cannot hold unambiguously."""
    if any(char in rel for char in "\t\n\r"):
        raise RawDataError(f"raw file name {rel!r} contains a tab or newline; rename it")


def format_manifest(entries: Mapping[str, Entry]) -> str:
    """Render entries as manifest text, sorted by path so that diffs stay small."""
    lines = ["\t".join(HEADER)]
    for rel in sorted(entries):
        check_path(rel)
        entry = entries[rel]
        lines.append(f"{rel}\t{entry.size}\t{entry.mode:04o}\t{entry.sha256}")
    return "\n".join(lines) + "\n"


def parse_manifest(text: str, source: str) -> dict[str, Entry]:
    """Parse manifest text; ``source`` names the file in error messages."""
    lines = text.splitlines()
    if not lines or tuple(lines[0].split("\t")) != HEADER:
        raise RawDataError(f"{source}:1: header must be {' '.join(HEADER)!r} (tab-separated)")
    entries: dict[str, Entry] = {}
    for number, line in enumerate(lines[1:], start=2):
        match = _LINE.fullmatch(line)
        if match is None:
            raise RawDataError(
                f"{source}:{number}: expected path, size, octal mode and sha256, tab-separated"
            )
        written, size, mode, sha256 = match.groups()
        rel = posixpath.normpath(written)  # a hand-edited ./a.csv or a//b.csv names a file too
        if rel.startswith("/") or rel == "." or ".." in rel.split("/") or rel in entries:
            raise RawDataError(f"{source}:{number}: path {rel!r} is absolute, escapes or repeats")
        entries[rel] = Entry(int(size), int(mode, 8), sha256)
    return entries


def read_manifest(path: Path) -> dict[str, Entry]:
    """Read the manifest at ``path``; a missing file is an error that says what to run."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = f"`{PROGRAM} data freeze` records the raw data"
        raise RawDataError(f"no manifest at {path}; {hint}") from None
    except UnicodeDecodeError:
        raise RawDataError(f"manifest {path}: not UTF-8 text") from None
    except OSError as err:  # a folder in its place, no read permission
        raise RawDataError(f"manifest {path}: cannot be read: {err.strerror}") from None
    return parse_manifest(text, str(path))


def stage_manifest(path: Path) -> Path:
    """Create the temporary file that ``write_manifest`` fills: proof the folder is writable."""
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise RawDataError(f"manifest {path}: cannot be written: {err.strerror}") from None
    os.close(fd)
    return Path(name)


def write_manifest(path: Path, entries: Mapping[str, Entry], staged: Path | None = None) -> None:
    """Write the manifest atomically (into ``staged`` if given), so a crash leaves no half file."""
    text = format_manifest(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staged or stage_manifest(path)
    try:
        with tmp.open("w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        tmp.chmod(0o644)  # mkstemp makes 0600; the manifest is an ordinary committed file
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
