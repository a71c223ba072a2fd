"""Raw data that stays as delivered: ``data freeze``, ``data verify`` and ``verify_raw``.

``data freeze`` records every file below the raw-data folder in a committed manifest (path,
size, mode, SHA-256, see ``manifest.py``) and removes the write bits from those files.
``data verify`` compares the folder with the manifest and names every modified, missing,
added, renamed or permission-changed file. ``prepare`` and ``train`` call ``verify_raw``
before they read raw data. Nothing here writes below the raw folder except ``freeze``, and
``freeze`` only changes permission bits.

Directories stay writable on purpose: read-only directories break ``rm -rf``, ``git clean``
and copying new files in, while added or deleted files are caught by ``verify`` anyway.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from ..errors import DataError
from ..settings import get_settings
from .hashcache import HashCache
from .manifest import (
    PROGRAM,
    Entry,
    RawDataError,
    check_path,
    read_manifest,
    stage_manifest,
    write_manifest,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator, Mapping

__all__ = [
    "MANIFEST_PATH",
    "RawDataError",
    "add_data_command",
    "compare",
    "default_paths",
    "freeze",
    "verify",
    "verify_raw",
]

#: The committed manifest, relative to the project root. It stays in the repository even
#: when ``DATA_DIR`` puts the data itself on another file system.
MANIFEST_PATH = Path("data") / "raw.manifest.tsv"
#: Hash cache, next to the raw folder (git-ignored).
CACHE_NAME = ".raw-cache.json"
#: Placeholders that keep an empty folder in git; they are not data.
IGNORED_NAMES = frozenset({".gitkeep"})

# Kinds of change, as printed.
MODIFIED = "modified"
MISSING = "missing"
ADDED = "added"
RENAMED = "renamed"
PERMISSIONS = "permissions"

_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
_CHUNK = 1 << 20
# Hashing releases the GIL, and parallel reads help most on cluster file systems.
_WORKERS = min(8, os.cpu_count() or 1)
_SHOWN = 3  # changes named in a one-line message

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Change:
    """One difference between the raw folder and the manifest."""

    path: str
    kind: str
    detail: str = ""

    def describe(self, raw_dir: Path, width: int = 11) -> str:
        """One report line, e.g. ``modified    data/raw/a.csv (size 10 -> 8)``."""
        if self.kind == RENAMED:
            return f"{self.kind:<{width}} {raw_dir / self.path} -> {raw_dir / self.detail}"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.kind:<{width}} {raw_dir / self.path}{detail}"


def near(path: Path) -> Path:
    """``path`` relative to the working directory if it lies below it, for short messages."""
    here = Path.cwd()
    return path.relative_to(here) if path.is_relative_to(here) else path


def default_paths() -> tuple[Path, Path]:
    """The raw folder and manifest of this project; ``PROJECT_ROOT``, ``DATA_DIR`` apply."""
    settings = get_settings()
    return near(settings.raw_dir), near(settings.project_root / MANIFEST_PATH)


def scan(raw_dir: Path) -> dict[str, os.stat_result]:
    """Stat every regular file below ``raw_dir`` (following symlinks), keyed by POSIX path.

    Plain ``os.scandir`` with string paths: on trees of 100,000 files, ``pathlib`` objects
    would take most of the time of a cached verify.
    """
    if not raw_dir.is_dir():
        raise RawDataError(f"raw-data folder {raw_dir} does not exist")
    found: dict[str, os.stat_result] = {}
    root = raw_dir.stat()
    seen = {(root.st_dev, root.st_ino)}  # folders already walked: guards against link loops
    pending = [("", os.fspath(raw_dir))]
    while pending:
        prefix, folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError as err:
            raise RawDataError(f"raw-data folder {folder} cannot be read: {err.strerror}") from None
        for entry in entries:
            try:
                st = entry.stat()  # follows symlinks
            except FileNotFoundError:  # a dangling symlink has no content to check
                continue
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    pending.append((f"{prefix}{entry.name}/", entry.path))
            elif stat.S_ISREG(st.st_mode) and entry.name not in IGNORED_NAMES:
                found[prefix + entry.name] = st
    return found


def sha256_file(
    path: Path, buffer: memoryview | None = None, advance: Callable[[int], None] | None = None
) -> str:
    """SHA-256 of a file, read in chunks the size of ``buffer`` (default 1 MiB)."""
    view = memoryview(bytearray(_CHUNK)) if buffer is None else buffer
    digest = hashlib.sha256()
    try:
        with path.open("rb", buffering=0) as handle:
            while size := handle.readinto(view):
                digest.update(view[:size])
                if advance is not None:
                    advance(size)
    except OSError as err:
        raise RawDataError(f"file {path} cannot be read: {err.strerror}") from None
    return digest.hexdigest()


def _batches(rels: list[str], stats: Mapping[str, os.stat_result]) -> Iterator[list[str]]:
    """Group files into tasks of about 64 MiB, so small files do not cost a task each."""
    batch: list[str] = []
    size = 0
    for rel in rels:
        batch.append(rel)
        size += stats[rel].st_size + 4096  # the open/close cost counts like a 4 KiB read
        if size >= 64 * _CHUNK:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A thread-safe byte counter that draws a bar only on a terminal and after 0.5 s."""
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="hashing",
        delay=0.5,
        leave=False,
        disable=not sys.stderr.isatty(),
    )
    lock = threading.Lock()

    def advance(size: int) -> None:
        with lock:
            bar.update(size)

    try:
        yield advance
    finally:
        bar.close()


def hash_files(
    raw_dir: Path, stats: Mapping[str, os.stat_result], cache: HashCache, *, full: bool
) -> dict[str, str]:
    """SHA-256 of each file in ``stats``; cached sums are used unless ``full``."""
    sums: dict[str, str] = {}
    todo: list[str] = []
    for rel, st in stats.items():
        cached = None if full else cache.get(rel, st)
        if cached is None:
            todo.append(rel)
        else:
            sums[rel] = cached
    total = sum(stats[rel].st_size for rel in todo)
    with _progress(total) as advance, ThreadPoolExecutor(_WORKERS) as pool:

        def hash_batch(batch: list[str]) -> list[str]:
            buffer = memoryview(bytearray(_CHUNK))  # one per task, not one per file
            return [sha256_file(raw_dir / rel, buffer, advance) for rel in batch]

        batches = list(_batches(todo, stats))
        for batch, digests in zip(batches, pool.map(hash_batch, batches), strict=True):
            for rel, digest in zip(batch, digests, strict=True):
                sums[rel] = digest
                cache.put(rel, stats[rel], digest)
    return sums


def diff(old: Mapping[str, Entry], new: Mapping[str, Entry], gone: str = MISSING) -> list[Change]:
    """Changes from ``old`` to ``new``; an empty sha256 in ``new`` means "not hashed".

    A file that disappeared under one name and appeared with the same content under
    another is reported once, as renamed. ``gone`` names the kind for vanished files.
    """
    changes: list[Change] = []
    for rel in old.keys() & new.keys():
        before, after = old[rel], new[rel]
        if before == after:  # the common case, decided by one tuple comparison
            continue
        if before.size != after.size:
            changes.append(Change(rel, MODIFIED, f"size {before.size} -> {after.size}"))
        elif before.sha256 != after.sha256:
            changes.append(Change(rel, MODIFIED, "content differs"))
        if before.mode != after.mode:
            detail = f"mode {after.mode:04o}, manifest {before.mode:04o}"
            changes.append(Change(rel, PERMISSIONS, detail))
    vanished: dict[tuple[int, str], list[str]] = {}
    for rel in sorted(old.keys() - new.keys()):
        vanished.setdefault((old[rel].size, old[rel].sha256), []).append(rel)
    for rel in sorted(new.keys() - old.keys()):
        sources = vanished.get((new[rel].size, new[rel].sha256))
        if new[rel].sha256 and sources:
            changes.append(Change(sources.pop(0), RENAMED, rel))
        else:
            changes.append(Change(rel, ADDED))
    changes.extend(Change(rel, gone) for rels in vanished.values() for rel in rels)
    return sorted(changes)


def _cache(raw_dir: Path) -> HashCache:
    return HashCache(raw_dir.parent / CACHE_NAME, raw_dir)


def _compare(
    raw_dir: Path, expected: Mapping[str, Entry], cache: HashCache, *, full: bool
) -> tuple[list[Change], dict[str, os.stat_result]]:
    """Changes of ``raw_dir`` against ``expected``, hashing only what can decide a change."""
    stats = scan(raw_dir)
    vanished_sizes = {expected[rel].size for rel in expected.keys() - stats.keys()}
    to_hash = {
        rel: st
        for rel, st in stats.items()
        if (rel in expected and st.st_size == expected[rel].size)
        or (rel not in expected and st.st_size in vanished_sizes)  # rename candidates
    }
    sums = hash_files(raw_dir, to_hash, cache, full=full)
    actual = {
        rel: Entry(st.st_size, stat.S_IMODE(st.st_mode), sums.get(rel, ""))
        for rel, st in stats.items()
    }
    cache.keep_only(set(stats))
    cache.save()
    return diff(expected, actual), stats


def compare(raw_dir: Path, expected: Mapping[str, Entry], *, full: bool = False) -> list[Change]:
    """Every difference between ``raw_dir`` and ``expected``; empty when they match."""
    return _compare(raw_dir, expected, _cache(raw_dir), full=full)[0]


def verify(raw_dir: Path, manifest: Path, *, full: bool = False) -> list[Change]:
    """Every difference between ``raw_dir`` and the manifest file; empty when they match."""
    return compare(raw_dir, read_manifest(manifest), full=full)


def _summary(changes: list[Change], raw_dir: Path) -> str:
    named = ", ".join(change.describe(raw_dir, width=0) for change in changes[:_SHOWN])
    more = len(changes) - _SHOWN
    return named + (f" (+{more} more)" if more > 0 else "")


def verify_raw(raw_dir: Path, manifest: Path) -> None:
    """Raise ``RawDataError`` with a one-line message unless the raw content is as recorded.

    Permission drift alone (e.g. a fresh clone, where git gives files mode 0644) does not
    stop a run: the data is intact, so it is logged as a warning that says how to fix it.
    """
    raw_dir, manifest = near(raw_dir), near(manifest)
    changes = verify(raw_dir, manifest)
    content = [c for c in changes if c.kind != PERMISSIONS]
    if content:
        raise RawDataError(
            f"raw data in {raw_dir} does not match {manifest}: {_summary(content, raw_dir)}; "
            f"run `{PROGRAM} data verify` for the full list"
        )
    if changes:
        log.warning(
            "%d raw file(s) in %s have other permissions than recorded; "
            "`%s data freeze` makes them read-only again",
            len(changes),
            raw_dir,
            PROGRAM,
        )


def _set_mode(path: Path, st: os.stat_result, mode: int) -> os.stat_result:
    """Set ``mode`` on ``path`` if needed and return the new stat (chmod changes ctime)."""
    if stat.S_IMODE(st.st_mode) == mode:
        return st
    try:
        path.chmod(mode)
    except PermissionError:  # e.g. a symlinked shared data set owned by someone else
        log.warning("cannot change permissions of %s (not its owner); left as they are", path)
        return st
    return path.stat()


def freeze(raw_dir: Path, manifest: Path, *, update: bool, full: bool = False) -> list[Change]:
    """Record the raw folder in the manifest and make its files read-only.

    Without ``update`` an existing manifest is never changed: the content must still match
    it, and only the recorded permissions are restored (e.g. after copying the data to a
    new machine). With ``update`` the manifest is rewritten from the folder as it is now.
    Returns the changes against the previous manifest.
    """
    cache = _cache(raw_dir)
    old = read_manifest(manifest) if manifest.exists() else None
    if old is not None and not update:
        changes, stats = _compare(raw_dir, old, cache, full=full)
        content = [c for c in changes if c.kind != PERMISSIONS]
        if content:
            raise RawDataError(
                f"raw data in {raw_dir} differs from {manifest}: {_summary(content, raw_dir)}; "
                f"record it with `{PROGRAM} data freeze --update`"
            )
        for change in changes:
            st = stats[change.path]
            if _inside(raw_dir, raw_dir / change.path):  # never chmod outside the raw folder
                st = _set_mode(raw_dir / change.path, st, old[change.path].mode)
            cache.put(change.path, st, old[change.path].sha256)
        cache.save()
        return changes
    stats = scan(raw_dir)
    for rel in stats:  # before anything changes on disk
        check_path(rel)
    sums = hash_files(raw_dir, stats, cache, full=full)
    # All or nothing: the manifest's folder must take the new manifest before any file's
    # mode changes, and a failure after that puts the old modes back.
    staged = stage_manifest(manifest)
    restore: dict[str, int] = {}
    try:
        entries: dict[str, Entry] = {}
        for rel, st in stats.items():
            frozen = st
            if _inside(raw_dir, raw_dir / rel):  # never chmod what a link points to outside
                frozen = _set_mode(raw_dir / rel, st, stat.S_IMODE(st.st_mode) & ~_WRITE_BITS)
                if frozen is not st:
                    restore[rel] = stat.S_IMODE(st.st_mode)
            else:
                log.warning("%s links outside %s: recorded, permissions left", rel, raw_dir)
            cache.put(rel, frozen, sums[rel])
            entries[rel] = Entry(frozen.st_size, stat.S_IMODE(frozen.st_mode), sums[rel])
        write_manifest(manifest, entries, staged)
    except BaseException:
        staged.unlink(missing_ok=True)
        for rel, mode in restore.items():
            (raw_dir / rel).chmod(mode)
        raise
    cache.keep_only(set(stats))
    cache.save()
    return diff(old or {}, entries, gone="removed")


def _inside(raw_dir: Path, path: Path) -> bool:
    """Whether ``path``, links resolved, lies below ``raw_dir`` (links resolved too)."""
    return path.resolve().is_relative_to(raw_dir.resolve())


def _run_freeze(args: argparse.Namespace) -> int:
    raw_dir, manifest = _resolve(args)
    had_manifest = manifest.exists()
    changes = freeze(raw_dir, manifest, update=args.update, full=args.full)
    if not had_manifest:  # every file is new: a count says more than a list of thousands
        entries = read_manifest(manifest).values()
        mib = sum(entry.size for entry in entries) / 2**20
        print(f"recorded {len(entries)} raw files ({mib:.1f} MiB) in {manifest}, now read-only")
        return 0
    for change in changes:
        print(change.describe(raw_dir))
    if args.update:
        print(f"{manifest}: {len(changes) or 'no'} change(s) recorded")
    else:
        print(f"{manifest} unchanged; {len(changes)} file(s) made read-only again")
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    raw_dir, manifest = _resolve(args)
    changes = verify(raw_dir, manifest, full=args.full)
    for change in changes:
        print(change.describe(raw_dir))
    if changes:
        print(
            f"{raw_dir}: {len(changes)} difference(s) from {manifest}; if intended, record "
            f"them with `{PROGRAM} data freeze --update`",
            file=sys.stderr,
        )
        return 1
    print(f"{raw_dir}: all files match {manifest}")
    return 0


def _resolve(args: argparse.Namespace) -> tuple[Path, Path]:
    raw_dir, manifest = default_paths()
    return args.raw_dir or raw_dir, args.manifest or manifest


def run_data_command(args: argparse.Namespace) -> int:
    """Run a ``data`` action; errors become one line on stderr and exit 1."""
    try:
        code: int = args.data_handler(args)
        return code
    except (RawDataError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def add_data_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add ``data freeze [--update] [--full]`` and ``data verify [--full]`` to a CLI.

    The parsed namespace gets ``func=run_data_command``, which returns the exit code. Returns
    the actions of ``data``, for the source record's (``sources.add_source_commands``).
    """
    data = subparsers.add_parser(
        "data",
        help="freeze and verify the raw data; record and check the files streams read",
        description="Keep the data as delivered: record it once, then check it.",
    )
    data.set_defaults(func=run_data_command)
    actions = data.add_subparsers(dest="data_action", required=True, metavar="ACTION")
    freeze_parser = actions.add_parser(
        "freeze",
        help="record the raw files in the manifest and make them read-only",
        description="Record every raw file (path, size, mode, SHA-256) and remove write "
        "permission. With an existing manifest only permissions are restored, unless "
        "--update is given.",
    )
    freeze_parser.add_argument(
        "--update", action="store_true", help="rewrite the manifest from the files as they are now"
    )
    freeze_parser.set_defaults(data_handler=_run_freeze)
    verify_parser = actions.add_parser(
        "verify",
        help="check the raw files against the manifest",
        description="Report every modified, missing, added, renamed or permission-changed "
        "raw file; exit 1 if there is any.",
    )
    verify_parser.set_defaults(data_handler=_run_verify)
    for parser in (freeze_parser, verify_parser):
        parser.add_argument(
            "--full", action="store_true", help="hash every file, ignoring the metadata cache"
        )
        parser.add_argument(
            "--raw-dir", type=Path, help="raw-data folder (default: $DATA_DIR/raw or data/raw)"
        )
        parser.add_argument(
            "--manifest", type=Path, help=f"manifest file (default: {MANIFEST_PATH.as_posix()})"
        )
    return actions
