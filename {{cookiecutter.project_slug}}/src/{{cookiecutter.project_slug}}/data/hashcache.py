"""A cache of SHA-256 sums keyed by file metadata, so that a repeated verify reads no data.

An entry is trusted only while size, mtime, ctime and inode of the file are all unchanged.
ctime cannot be set from user space, so even a writer that restores the old mtime (``touch
-r``, ``rsync -t``) invalidates the entry. The cache lives outside the raw folder, is never
committed, and losing it only costs one full hash pass (``data verify --full`` ignores it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def file_digest(path: Path) -> str:
    """SHA-256 of a file, read in 8 MiB pieces."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(8 << 20):
            sha.update(piece)
    return sha.hexdigest()


_VERSION = 1


_WIDTH = 5  # size, mtime, ctime, inode, sha256


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class HashCache:
    """SHA-256 sums of the files below one root folder, stored as JSON in ``path``."""

    def __init__(self, path: Path, root: Path) -> None:
        """Load the cache at ``path`` for files below ``root``; unreadable means empty."""
        self.path = path
        self.root = str(root.resolve())
        self._entries: dict[str, list[int | str]] = {}
        self._dirty = False
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return
        files = data.get("files")
        if data.get("root") == self.root and isinstance(files, dict):
            # Anything malformed (a hand edit, another tool) is dropped, never trusted.
            self._entries = {
                rel: entry
                for rel, entry in files.items()
                if isinstance(entry, list) and len(entry) == _WIDTH
            }

    def get(self, rel: str, st: os.stat_result) -> str | None:
        """The cached sum of ``rel`` if its metadata still equals ``st``, else None."""
        entry = self._entries.get(rel)
        if entry and entry[:-1] == _key(st) and isinstance(entry[-1], str):
            return entry[-1]
        return None

    def put(self, rel: str, st: os.stat_result, sha256: str) -> None:
        """Remember that ``rel`` with metadata ``st`` has sum ``sha256``."""
        entry: list[int | str] = [*_key(st), sha256]
        if self._entries.get(rel) != entry:
            self._entries[rel] = entry
            self._dirty = True

    def keep_only(self, rels: set[str]) -> None:
        """Forget files that no longer exist, so the cache does not grow forever."""
        stale = self._entries.keys() - rels
        for rel in stale:
            del self._entries[rel]
        self._dirty = self._dirty or bool(stale)

    def save(self) -> None:
        """Write the cache atomically; a read-only location just means no cache."""
        if not self._dirty:
            return
        data = {"version": _VERSION, "root": self.root, "files": self._entries}
        try:
            fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        except OSError:  # read-only or missing folder
            return
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, separators=(",", ":"))
            tmp.replace(self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        self._dirty = False
