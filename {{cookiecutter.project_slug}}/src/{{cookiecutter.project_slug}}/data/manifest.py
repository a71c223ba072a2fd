"""The committed manifest files: one tab-separated line per file, sorted by path.

Both are plain text that diffs well: a header row, then one line per file.

- The raw-data manifest (``data freeze``): ``path  size  mode  sha256``. Paths are POSIX paths
  relative to the raw-data folder; ``mode`` is the octal permission set that ``data freeze``
  left on the file.
- The source record (``data record``, ``sources.py``): ``path  size  sha256`` of the files
  streams read from outside ``data/processed``. A path is relative to ``DATA_DIR`` where the
  file lies below it, else absolute.
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
SOURCES_HEADER = ("path", "size", "sha256")
# One regular expression per line keeps reading 100,000 entries well under a second.
_LINE = re.compile(r"([^\t]+)\t([0-9]+)\t(0[0-7]{3,4})\t([0-9a-f]{64})")
_SOURCES_LINE = re.compile(r"([^\t]+)\t([0-9]+)\t([0-9a-f]{64})")


class RawDataError(Exception):
    """Raw data and manifest disagree, or one of them cannot be read (one-line message)."""


class Entry(NamedTuple):
    """What the manifest records about one raw file (a tuple: cheap for 100,000 files)."""

    size: int
    mode: int
    sha256: str


class Source(NamedTuple):
    """What the source record holds about one file a stream reads from outside data/processed."""

    size: int
    sha256: str


def check_path(rel: str, kind: str = "raw file") -> None:
    """Reject a path that one manifest line cannot hold unambiguously."""
    if any(char in rel for char in "\t\n\r"):
        raise RawDataError(f"{kind} name {rel!r} contains a tab or newline; rename it")


def _format(header: tuple[str, ...], rows: Mapping[str, str], kind: str) -> str:
    """Manifest text: the header, then ``path<TAB>row`` sorted by path so that diffs stay small."""
    lines = ["\t".join(header)]
    for rel in sorted(rows):
        check_path(rel, kind)
        lines.append(f"{rel}\t{rows[rel]}")
    return "\n".join(lines) + "\n"


def _parse(
    text: str, source: str, header: tuple[str, ...], line: re.Pattern[str], *, absolute: bool
) -> dict[str, re.Match[str]]:
    """``{path: the match of its line}``; ``absolute``: whether a path may be absolute."""
    lines = text.splitlines()
    if not lines or tuple(lines[0].split("\t")) != header:
        raise RawDataError(f"{source}:1: header must be {' '.join(header)!r} (tab-separated)")
    entries: dict[str, re.Match[str]] = {}
    for number, row in enumerate(lines[1:], start=2):
        match = line.fullmatch(row)
        if match is None:
            fields = ", ".join(header[:-1]) + " and " + header[-1]
            raise RawDataError(f"{source}:{number}: expected {fields}, tab-separated")
        rel = posixpath.normpath(match[1])  # a hand-edited ./a.csv or a//b.csv names a file too
        outside = rel.startswith("/") and not absolute
        if outside or rel == "." or ".." in rel.split("/") or rel in entries:
            what = "escapes or repeats" if absolute else "is absolute, escapes or repeats"
            raise RawDataError(f"{source}:{number}: path {rel!r} {what}")
        entries[rel] = match
    return entries


def format_manifest(entries: Mapping[str, Entry]) -> str:
    """Render entries as raw-data manifest text."""
    rows = {rel: f"{e.size}\t{e.mode:04o}\t{e.sha256}" for rel, e in entries.items()}
    return _format(HEADER, rows, "raw file")


def parse_manifest(text: str, source: str) -> dict[str, Entry]:
    """Parse raw-data manifest text; ``source`` names the file in error messages."""
    matches = _parse(text, source, HEADER, _LINE, absolute=False)
    return {rel: Entry(int(m[2]), int(m[3], 8), m[4]) for rel, m in matches.items()}


def format_sources(entries: Mapping[str, Source]) -> str:
    """Render entries as source-record text."""
    rows = {name: f"{e.size}\t{e.sha256}" for name, e in entries.items()}
    return _format(SOURCES_HEADER, rows, "source file")


def parse_sources(text: str, source: str) -> dict[str, Source]:
    """Parse source-record text; ``source`` names the file in error messages."""
    matches = _parse(text, source, SOURCES_HEADER, _SOURCES_LINE, absolute=True)
    return {name: Source(int(m[2]), m[3]) for name, m in matches.items()}


def _read_text(path: Path) -> str:
    """The text of a manifest file; FileNotFoundError is left to the caller."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise RawDataError(f"manifest {path}: not UTF-8 text") from None
    except OSError as err:  # a folder in its place, no read permission
        raise RawDataError(f"manifest {path}: cannot be read: {err.strerror}") from None


def read_manifest(path: Path) -> dict[str, Entry]:
    """Read the manifest at ``path``; a missing file is an error that says what to run."""
    try:
        text = _read_text(path)
    except FileNotFoundError:
        hint = f"`{PROGRAM} data freeze` records the raw data"
        raise RawDataError(f"no manifest at {path}; {hint}") from None
    return parse_manifest(text, str(path))


def read_sources(path: Path) -> dict[str, Source]:
    """Read the source record at ``path``; none yet is an empty record."""
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return {}
    return parse_sources(text, str(path))


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
    _write(path, format_manifest(entries), staged)


def write_sources(path: Path, entries: Mapping[str, Source]) -> None:
    """Write the source record atomically."""
    _write(path, format_sources(entries), None)


def _write(path: Path, text: str, staged: Path | None) -> None:
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
