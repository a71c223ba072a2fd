"""The raw-data manifest file: one tab-separated line per raw file.

The manifest is committed to git, so it is plain text that diffs well: a header row, then
``path  size  mode  sha256`` per file, sorted by path. Paths are POSIX paths relative to the
raw-data folder; ``mode`` is the octal permission set that ``data freeze`` left on the file.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

HEADER = ("path", "size", "mode", "sha256")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODE = re.compile(r"^0[0-7]{3,4}$")


class RawDataError(Exception):
    """Raw data and manifest disagree, or one of them cannot be read (one-line message)."""


@dataclass(frozen=True)
class Entry:
    """What the manifest records about one raw file."""

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
        fields = line.split("\t")
        if len(fields) != len(HEADER):
            raise RawDataError(f"{source}:{number}: expected 4 tab-separated fields")
        rel, size, mode, sha256 = fields
        if not size.isdigit() or not _MODE.match(mode) or not _SHA256.match(sha256):
            raise RawDataError(f"{source}:{number}: bad size, octal mode or sha256 for {rel}")
        if not rel or rel.startswith("/") or ".." in rel.split("/") or rel in entries:
            raise RawDataError(f"{source}:{number}: path {rel!r} is empty, absolute or repeated")
        entries[rel] = Entry(size=int(size), mode=int(mode, 8), sha256=sha256)
    return entries


def read_manifest(path: Path) -> dict[str, Entry]:
    """Read the manifest at ``path``; a missing file is an error that says what to run."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = f"`{__package__} data freeze` records the raw data"
        raise RawDataError(f"no manifest at {path}; {hint}") from None
    return parse_manifest(text, str(path))


def write_manifest(path: Path, entries: Mapping[str, Entry]) -> None:
    """Write the manifest atomically, so that a crash never leaves half a file."""
    text = format_manifest(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        tmp.chmod(0o644)  # mkstemp makes 0600; the manifest is an ordinary committed file
        tmp.replace(path)
    except BaseException:
        tmp.unlink()
        raise
