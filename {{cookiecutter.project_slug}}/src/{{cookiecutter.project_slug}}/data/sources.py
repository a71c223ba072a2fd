"""Files streams read from outside ``data/processed``: recorded at first use, checked after.

``prepare`` guards what it writes with ``SHA256SUMS`` and ``data freeze`` guards ``data/raw``.
A stream may also read files from elsewhere (its ``source_files()``, e.g. parquet files in
``data/external``). Those are kept in the source record, ``data/sources.manifest.tsv`` in the
project (path, size and SHA-256 per file, format in ``manifest.py``), which is committed like
the raw-data manifest and stays in the repository when ``DATA_DIR`` moves the data.

``train`` looks up each such file when it starts: one that differs from its record is refused
in one line, whatever the run's name. One not yet recorded is added when the run's segment
ends, unless reading the data failed in it: a file is recorded once a run has read it without
finding it damaged, so a damaged copy is not recorded by the run that found it, and its
repaired copy is not refused. ``data record`` records files or
folders before any run, and with ``--update`` is the one way to accept a changed file;
``data check`` compares files with the record, e.g. after a copy to the cluster.

A file damaged before its first use is recorded as it is: only the readers' own checks (a
tar's end marker, a parquet file's footer and page checksums) or a digest published with
the data can tell.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError
from ..settings import get_settings
from .hashcache import HashCache
from .manifest import PROGRAM, RawDataError, Source, read_sources, write_sources
from .rawdata import MISSING, MODIFIED, Change, hash_files, near

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Iterator, Mapping

#: The committed record, relative to the project root (beside ``data/raw.manifest.tsv``).
RECORD_PATH = Path("data") / "sources.manifest.tsv"
#: Sums of the source files by file metadata, below DATA_DIR (git-ignored, machine-specific).
CACHE_PATH = Path(".cache") / "stream-sources.sha256.json"
UNRECORDED = "unrecorded"  # kinds of change, as `data check PATH` and `data record` print them
REMOVED = "removed"
_SHOWN = 3  # files named in a one-line refusal

# POSIX record locks belong to a process, and closing any descriptor of the lock file drops
# them: this lock keeps the threads of one process apart as well.
_THREADS = threading.Lock()


class CannotRecordError(DataError):
    """The record or its lock file cannot be written (e.g. a read-only project root)."""


def record_name(path: Path, data_dir: Path) -> str:
    """A file's record name (links resolved): relative to DATA_DIR below it, else absolute."""
    return _name(path.resolve(), data_dir.resolve())


def _name(resolved: Path, root: Path) -> str:
    """The record name of a resolved path, ``root`` being the resolved DATA_DIR."""
    return (resolved.relative_to(root) if resolved.is_relative_to(root) else resolved).as_posix()


def _file(name: str, data_dir: Path) -> Path:
    """The file a record name stands for."""
    return Path(name) if name.startswith("/") else data_dir / name


def fingerprint(paths: Iterable[Path], data_dir: Path, *, full: bool = False) -> dict[str, Source]:
    """Size and SHA-256 of each file by record name; sums cached by file metadata unless ``full``.

    The cache is keyed by absolute path, so a file is hashed once whichever name leads to it.
    """
    with contextlib.suppress(OSError):  # a read-only DATA_DIR: no cache, every file hashed
        (data_dir / CACHE_PATH).parent.mkdir(parents=True, exist_ok=True)
    cache = HashCache(data_dir / CACHE_PATH, Path("/"))
    root = data_dir.resolve()
    stats: dict[str, os.stat_result] = {}  # by absolute path without its leading "/"
    names: dict[str, str] = {}
    for path in paths:
        resolved = path.resolve()
        key = resolved.relative_to("/").as_posix()
        try:
            stats[key] = resolved.stat()
        except OSError as err:
            raise DataError(f"source file {path} cannot be read: {err.strerror}") from None
        names[key] = _name(resolved, root)
    try:
        sums = hash_files(Path("/"), stats, cache, full=full)
    except RawDataError as err:  # an unreadable file: one line naming it
        raise DataError(str(err)) from None
    cache.save()
    return {names[key]: Source(st.st_size, sums[key]) for key, st in stats.items()}


def _read(record: Path) -> dict[str, Source]:
    try:
        return read_sources(near(record))
    except RawDataError as err:  # a damaged record: one line naming its file and line
        raise DataError(str(err)) from None


def _changes(
    found: Mapping[str, Source], known: Mapping[str, Source], data_dir: Path
) -> list[Change]:
    """The files of ``found`` that differ from their record (unrecorded ones are not here)."""
    changes = []
    for name in sorted(found.keys() & known.keys()):
        now, then = found[name], known[name]
        shown = str(near(_file(name, data_dir)))
        if now.size != then.size:
            changes.append(Change(shown, MODIFIED, f"size {then.size} -> {now.size}"))
        elif now.sha256 != then.sha256:
            changes.append(Change(shown, MODIFIED, "content differs"))
    return changes


def _refusal(changes: list[Change], record: Path) -> DataError:
    """One line: the differing files (the first few), what differs, how to accept the change."""
    more = len(changes) - _SHOWN
    named = ", ".join(f"{change.path} ({change.detail})" for change in changes[:_SHOWN])
    paths = " ".join(change.path for change in changes[:_SHOWN])
    if more > 0:
        named, paths = f"{named} (+{more} more)", f"{paths} ..."
    which = "source file" if len(changes) == 1 else "source files"
    differ = "differs from its record" if len(changes) == 1 else "differ from their record"
    return DataError(
        f"{which} {named} {differ} in {near(record)}; if the change is intended, record it "
        f"with `{PROGRAM} data record --update {paths}`"
    )


@contextmanager
def _locked(record: Path) -> Iterator[None]:
    """Hold the record's lock file, so that runs starting together all add their files.

    A POSIX record lock, as on run directories: honoured over NFS, and released by the system
    when its holder dies. A file system without locks is used unprotected, with a warning.
    """
    path = record.with_name(f".{record.name}.lock")
    with _THREADS:
        with contextlib.suppress(OSError):  # DATA_DIR elsewhere: the project's data/ may be new
            record.parent.mkdir(parents=True, exist_ok=True)
        try:  # writable for whom the umask says: the group too, in a shared project
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise CannotRecordError(f"{near(record)} cannot be written: {err.strerror}") from None
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
            except OSError as err:
                if err.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                print(f"warning: cannot lock {path} ({err.strerror})", file=sys.stderr)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def _write(record: Path, entries: Mapping[str, Source]) -> None:
    """Replace the record atomically (temporary file and rename)."""
    try:
        write_sources(record, entries)
    except RawDataError as err:  # its folder takes no new file
        raise CannotRecordError(str(err)) from None
    except OSError as err:
        raise CannotRecordError(f"{near(record)} cannot be written: {err.strerror}") from None


def check_record(found: Mapping[str, Source], record: Path, data_dir: Path) -> None:
    """Refuse, in one line, a file of `found` that differs from its record (new ones pass)."""
    if record.is_file() and (changes := _changes(found, _read(record), data_dir)):
        raise _refusal(changes, record)


def record_new(found: Mapping[str, Source], record: Path) -> str | None:
    """Add the files of `found` that the record lacks; the line to show (None: none new).

    The record is read again under its lock before it is written: another run may have added
    files since (its entries are kept). Where it cannot be written, the line warns.
    """
    known = _read(record) if record.is_file() else {}
    if found.keys() <= known.keys():  # every later segment: no lock, nothing written
        return None
    try:
        with _locked(record):
            known = _read(record) if record.is_file() else {}
            if new := found.keys() - known.keys():
                _write(record, {**known, **{name: found[name] for name in new}})
    except CannotRecordError as err:
        return f"warning: {len(found.keys() - known.keys())} new source file(s) not recorded: {err}"
    return f"recorded {len(new)} new source file(s) in {near(record)} (commit it)" if new else None


def files_below(paths: Iterable[Path], record: Path) -> list[Path]:
    """Each path that is a file and every file below each folder; a bad path is one line.

    Below a folder, hidden files and folders (caches, lock files, `.gitkeep`) and the record
    itself are left out: they are not data.
    """
    files: list[Path] = []
    itself = record.resolve()
    for path in paths:
        if path.is_dir():
            below = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
                and p.resolve() != itself
            )
            if not below:
                raise DataError(f"{path}: no files in this folder")
            files += below
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return files


def record_files(
    paths: list[Path], data_dir: Path, record: Path, *, update: bool, full: bool = False
) -> tuple[list[Change], int]:
    """Record files and folders; return the changes accepted and the number of new files.

    Without ``update`` a file that differs from its record is refused and nothing is written.
    With it, such a file is recorded as it is now, and recorded files below a given folder
    that are gone are removed from the record.
    """
    found = fingerprint(files_below(paths, record), data_dir, full=full)
    folders = [record_name(path, data_dir) for path in paths if path.is_dir()]
    with _locked(record):
        known = _read(record)
        changes = _changes(found, known, data_dir)
        if changes and not update:
            raise _refusal(changes, record)
        gone = [name for name in known.keys() - found.keys() if update and _below(name, folders)]
        changes += [Change(str(near(_file(name, data_dir))), REMOVED) for name in gone]
        new = len(found.keys() - known.keys())
        if new or changes:
            _write(record, {name: known[name] for name in known.keys() - set(gone)} | found)
    return sorted(changes), new


def _below(name: str, folders: list[str]) -> bool:
    """Whether the record name ``name`` lies below one of the ``folders`` (record names)."""
    relative = not name.startswith("/")
    return any(name.startswith(f"{folder}/") or (folder == "." and relative) for folder in folders)


def check_files(
    paths: Iterable[Path], data_dir: Path, record: Path, *, full: bool = False
) -> tuple[list[Change], int]:
    """The files that differ from the record, are missing or are not recorded; and a count.

    ``paths`` (files or folders) are checked, or every recorded file where there are none.
    """
    if not record.is_file():
        hint = f"`{PROGRAM} data record` records the files streams read"
        raise DataError(f"no source record at {near(record)}; {hint}")
    known = _read(record)
    given = files_below(paths, record)
    named = (
        {record_name(path, data_dir): path for path in given}
        if given
        else {name: _file(name, data_dir) for name in known}
    )
    there = {name: path for name, path in named.items() if path.is_file()}
    found = fingerprint(there.values(), data_dir, full=full)
    changes = _changes(found, known, data_dir)
    changes += [Change(str(near(named[name])), MISSING) for name in named.keys() - there.keys()]
    changes += [Change(str(near(named[name])), UNRECORDED) for name in found.keys() - known.keys()]
    return sorted(changes), len(named)


def _locations() -> tuple[Path, Path]:
    """This project's DATA_DIR and source record."""
    settings = get_settings()
    return settings.data_dir, settings.project_root / RECORD_PATH


def _run_record(args: argparse.Namespace) -> int:
    data_dir, record = _locations()
    paths = args.paths or [near(data_dir / "external")]
    changes, new = record_files(paths, data_dir, record, update=args.update, full=args.full)
    for change in changes:
        print(change.describe(Path()))
    if changes:
        changed = sum(change.kind == MODIFIED for change in changes)
        counted = ((new, "new"), (changed, "changed"), (len(changes) - changed, REMOVED))
        counts = ", ".join(f"{count} {kind}" for count, kind in counted if count)
        print(f"updated {near(record)}: {counts} source file(s) (commit it)")
    elif new:
        print(f"recorded {new} new source file(s) in {near(record)} (commit it)")
    else:
        print(f"{near(record)} unchanged: every file is recorded as it is")
    return 0


def _run_check(args: argparse.Namespace) -> int:
    data_dir, record = _locations()
    changes, checked = check_files(args.paths, data_dir, record, full=args.full)
    for change in changes:
        print(change.describe(Path()))
    if changes:
        print(
            f"{len(changes)} of {checked} source file(s) differ from {near(record)}; if "
            f"intended, record them with `{PROGRAM} data record --update PATH ...`",
            file=sys.stderr,
        )
        return 1
    print(f"all {checked} files match {near(record)}")
    return 0


def add_source_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``data record [PATH ...] [--update] [--full]`` and ``data check [PATH ...] [--full]``."""
    record = actions.add_parser(
        "record",
        help=f"record files streams read from outside data/processed in {RECORD_PATH.as_posix()}",
        description="Record the size and SHA-256 of files and of every file in folders "
        "(hidden ones left out), as train does at their first use. A file that differs from "
        "its record is refused unless --update is given; with it, recorded files that are gone "
        "from a given folder are removed from the record.",
    )
    record.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="files or folders (default: $DATA_DIR/external)",
    )
    record.add_argument(
        "--update", action="store_true", help="accept files that differ from their record"
    )
    record.set_defaults(data_handler=_run_record)
    check = actions.add_parser(
        "check",
        help=f"check files streams read against {RECORD_PATH.as_posix()}",
        description="Name every file that differs from its record, is missing or is not "
        "recorded; exit 1 if there is any.",
    )
    check.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="files or folders (default: every recorded file)",
    )
    check.set_defaults(data_handler=_run_check)
    for parser in (record, check):
        parser.add_argument(
            "--full", action="store_true", help="hash every file, ignoring the metadata cache"
        )
