"""Processed data: written all-or-nothing by `prepare`, verified and staged for training.

`prepare` runs the task's `prepare` into a temporary folder beside `data/processed/<task>`,
records the SHA-256 of every file it wrote in `SHA256SUMS`, and only then swaps the folder in:
a failed or interrupted `prepare` leaves the previous processed data untouched.

Inside a job, `stage` copies that folder once per node to node-local disk (named by the
environment variable `data.node_tmp_var`): parallel file systems are slow for many small reads
from many GPUs, node-local disks are fast. The copy is checked against `SHA256SUMS`, so a stale
or damaged copy is never used. Files are copied and hashed in parallel threads (hashing and
file I/O release the GIL), after a check that the copy fits; a later segment of the same job
trusts a copy it has verified while no file's size or modification time has changed since.
Data read in place is checked too, with the sums cached by file metadata (as for the raw
data), so a repeated start reads no data to check it.

A run records `processed_digest`, the SHA-256 of `SHA256SUMS`, in its checkpoints: a resume
on processed data that `prepare` has changed since (another split, other files) is refused.
"""

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from ..config import Config
from ..errors import DataError
from ..settings import Settings
from ..task import Task
from .hashcache import HashCache, file_digest
from .sources import RECORD_PATH, check_record, fingerprint, record_new

DIGESTS = "SHA256SUMS"
VERIFIED = ".verified"  # in a staged copy: the job and file stats of its last verification
# Parallel copies: enough to keep a node-local NVMe disk and a parallel file system busy.
STAGE_THREADS = 8
# Room left on the node-local disk beyond the data itself (other files of the job).
STAGE_MARGIN = 256 * 2**20


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (DIGESTS, VERIFIED))


def write_digests(folder: Path) -> None:
    """Record `<sha256>  <relative path>` of every file in `folder`."""
    lines = [f"{file_digest(p)}  {p.relative_to(folder).as_posix()}\n" for p in _files(folder)]
    (folder / DIGESTS).write_text("".join(lines), encoding="utf-8")


def read_digests(folder: Path) -> dict[str, str]:
    """{relative path: sha256} from `folder/SHA256SUMS` (empty when there is none)."""
    path = folder / DIGESTS
    if not path.is_file():
        return {}
    pairs = (line.split("  ", 1) for line in path.read_text(encoding="utf-8").splitlines())
    return {name: digest for digest, name in pairs}


def processed_digest(folder: Path) -> str | None:
    """SHA-256 of `folder/SHA256SUMS`: one value for all processed files; None without it."""
    try:
        return hashlib.sha256((folder / DIGESTS).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def data_files(folder: Path, sources: list[Path], settings: Settings) -> dict[str, str]:
    """{file: sha256} of the processed files and of the files a stream reads from elsewhere.

    A stream's own files (a `source_files()` list, e.g. parquet files in data/external) are
    checked against the committed source record (`sources.py`): one that differs is refused
    in one line. Their sums are cached by file metadata, as the raw data's are, so a later
    start reads none of their bytes. Names are relative to DATA_DIR where they can be.
    Processed files (in place, or a staged copy on node-local disk, wherever it lies) are
    named by their `SHA256SUMS` entries already.
    """
    files = {f"processed/{folder.name}/{name}": sha for name, sha in read_digests(folder).items()}
    if not sources:
        return files
    found = fingerprint(_outside(folder, sources), settings.data_dir)
    check_record(found, settings.project_root / RECORD_PATH, settings.data_dir)
    return files | {name: source.sha256 for name, source in found.items()}


def record_sources(folder: Path, sources: list[Path], settings: Settings) -> str:
    """Add the files a stream read from elsewhere to the source record: the line to show.

    For the end of a segment in which reading the data never failed (`sources.py`); the sums
    come from the cache that `data_files` filled. "" when there was nothing new to record.
    """
    if not sources:
        return ""
    found = fingerprint(_outside(folder, sources), settings.data_dir)
    return record_new(found, settings.project_root / RECORD_PATH) or ""


def _outside(folder: Path, sources: list[Path]) -> list[Path]:
    """The files of `sources` that are not processed data (of `folder` or its staged copy)."""
    listed: dict[Path, dict[str, str]] = {}  # SHA256SUMS read once per folder, not per file
    return [path for path in map(Path, sources) if not _processed(path, folder, listed)]


def _processed(path: Path, folder: Path, listed: dict[Path, dict[str, str]]) -> bool:
    """Whether `path` is a file of `folder` or of its verified staged copy, in its SHA256SUMS.

    `listed` keeps each folder's SHA256SUMS once read (thousands of shards, one file).
    """
    for parent in path.resolve().parents:
        if parent == folder.resolve() or (parent / VERIFIED).is_file():
            if parent not in listed:
                listed[parent] = read_digests(parent)
            return path.resolve().relative_to(parent).as_posix() in listed[parent]
    return False


def check_same_data(
    saved: str | None,
    now: str | None,
    run: str,
    folder: Path,
    files: tuple[dict[str, str] | None, dict[str, str]] | None = None,
    *,
    repaired: list[str] | None = None,
) -> None:
    """Refuse a resume on data other than the run's (None saved: not recorded).

    `files`: the checkpoint's and today's `data_files`, to name what changed; `repaired`: the
    files the run stopped on as damaged, which may have changed since (their repair).
    """
    saved_files, current = files or (None, {})
    then = saved_files or {}  # None: not recorded, nothing to compare
    differ = {k for k in then.keys() | current.keys() if then.get(k) != current.get(k)}
    changed = sorted(differ - set(repaired or ()))
    if saved_files is not None and changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        name = changed[0]
        state = "is gone" if name not in current else "is new" if name not in then else "changed"
        raise DataError(
            f"run {run} was trained on other data: {name} {state} since its checkpoint"
            f"{more}; put the data back as it was, or start a new run.name"
        )
    if saved is None or saved == now:
        return
    now_text = f"is {now[:12]}" if now else "is missing"
    raise DataError(
        f"run {run} was trained on other processed data: {folder / DIGESTS} {now_text}, "
        f"the checkpoint's is {saved[:12]} (prepare ran again since); prepare the data as "
        "it was, or start a new run.name"
    )


def verify(folder: Path) -> None:
    """Check every file listed in `folder/SHA256SUMS`; sums are cached by file metadata."""
    cache = HashCache(folder.with_name(f".{folder.name}.sha256-cache.json"), folder)
    for name, digest in read_digests(folder).items():
        path = folder / name
        try:
            st = path.stat()
        except FileNotFoundError:
            missing = f"{path} is missing ({folder / DIGESTS} lists it): run prepare again"
            raise DataError(missing) from None
        actual = cache.get(name, st) or file_digest(path)
        if actual != digest:
            raise DataError(
                f"{path} does not match {folder / DIGESTS}: it changed after prepare; "
                "run prepare again"
            )
        cache.put(name, st, actual)
    cache.save()


def prepare(task: Task) -> str:
    """Run the task's `prepare` and swap the result in as `task.processed_dir`.

    Only a folder an earlier `prepare` made (it holds `SHA256SUMS`) or an empty one (a
    workflow tool makes the output's folder first) is replaced: anything else at that path
    is the user's, and is refused before the task runs.
    """
    target = task.processed_dir
    ours = (target / DIGESTS).is_file() or (target.is_dir() and not any(target.iterdir()))
    if target.exists() and not ours:
        raise DataError(
            f"{target} exists and prepare did not make it (no {DIGESTS}): move it away "
            "(or delete it, if an older prepare made it), then run prepare again"
        )
    with swapped_in(target) as tmp:
        line = task.prepare(tmp)
        write_digests(tmp)
    return line


@contextmanager
def swapped_in(target: Path) -> Iterator[Path]:
    """A fresh temporary folder beside `target` that replaces it when the block succeeds.

    All or nothing: an error in the block leaves `target` as it was (or absent); the previous
    `target` is removed only once the new one is in place. The temporary folders are named by
    host and PID, so leftovers of a writer that was killed (`kill -9`) are removed by the next
    writer, and never those of a writer that still runs (`remove_leftovers`).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target)
    me = f"{socket.gethostname()}-{os.getpid()}"
    tmp = target.with_name(f".{target.name}.tmp-{me}")
    old = target.with_name(f".{target.name}.old-{me}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if target.exists():
            target.rename(old)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _gone(host: str, pid: str) -> bool:
    """Whether the writer `pid` on `host` has ended (only this host's can be known)."""
    if host not in {"", socket.gethostname()} or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it runs
        return False
    return False


def remove_leftovers(target: Path) -> list[Path]:
    """Temporary folders beside `target` whose writer has ended: removed; returned.

    A writer killed between its two renames leaves the previous `target` as `.old-`: that is
    put back in place rather than removed.
    """
    removed = []
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-(?:(.+)-)?(\d+)")
    for path in sorted(target.parent.glob(f".{glob.escape(target.name)}.*-*")):
        found = pattern.fullmatch(path.name)
        if not found or not _gone(found[2] or "", found[3]):
            continue
        if found[1] == "old" and not target.exists():
            path.rename(target)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _copy_hashed(source: Path, target: Path) -> str:
    """Copy `source` to `target` and return the SHA-256 of the bytes copied (one read)."""
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as src, target.open("wb") as dst:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()


def _stats(folder: Path) -> dict[str, list[int]]:
    return {
        p.relative_to(folder).as_posix(): [p.stat().st_size, p.stat().st_mtime_ns]
        for p in _files(folder)
    }


def _trusted(target: Path, expected: dict[str, str], job: str) -> bool:
    """Whether this job verified `target` against `expected` and no file changed since."""
    try:
        mark = json.loads((target / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(job) and mark == {"job": job, "digests": expected, "stats": _stats(target)}


def _copy_verified(folder: Path, target: Path, expected: dict[str, str], var: str) -> None:
    """Replace `target` by a copy of `folder` whose files match `expected` (parallel)."""
    names = [p.relative_to(folder).as_posix() for p in _files(folder)]
    needed = sum((folder / name).stat().st_size for name in names)
    shutil.rmtree(target, ignore_errors=True)  # a stale copy: its space is needed
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if needed + STAGE_MARGIN > free:
        raise DataError(
            f"staging {folder} ({needed / 1e9:.2f} GB) to ${var}={target.parent.parent}: only "
            f"{free / 1e9:.2f} GB free there; free space or set data.stage_to_node_tmp=false"
        )
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with ThreadPoolExecutor(STAGE_THREADS) as pool:
            copied = pool.map(lambda name: _copy_hashed(folder / name, tmp / name), names)
            digests = dict(zip(names, copied, strict=True))
        if expected:
            shutil.copyfile(folder / DIGESTS, tmp / DIGESTS)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(
                f"staging {folder}: {err.filename or tmp}: no space left on ${var}; free "
                "space there or set data.stage_to_node_tmp=false"
            ) from None
        raise
    changed = sorted(name for name, digest in expected.items() if digests.get(name) != digest)
    if changed:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(
            f"{folder / changed[0]} does not match {folder / DIGESTS}: it changed after "
            "prepare; run prepare again"
        )
    tmp.rename(target)
    print(f"staged {folder} -> {target}", file=sys.stderr)


def stage(folder: Path, cfg: Config, local_rank: int) -> Path:
    """Inside a job, the node-local copy of `folder` (made by local rank 0); else `folder`.

    Either is checked against `SHA256SUMS` by local rank 0. The caller runs a barrier before
    the other ranks read the data.
    """
    var = cfg.data.node_tmp_var
    node_tmp = os.environ.get(var, "")
    if not folder.is_dir():
        return folder
    if not cfg.data.stage_to_node_tmp or not node_tmp or not Path(node_tmp).is_dir():
        if local_rank == 0 and cfg.data.stage_to_node_tmp and os.environ.get("SLURM_JOB_ID"):
            print(
                f"note: ${var} is not a folder here: reading {folder} from "
                "the shared file system (slower); set data.node_tmp_var to stage it",
                file=sys.stderr,
            )
        if local_rank == 0:
            verify(folder)
        return folder
    target = Path(node_tmp) / "processed" / folder.name
    job = os.environ.get("SLURM_JOB_ID", "")
    if local_rank == 0:
        expected = read_digests(folder)
        if _trusted(target, expected, job):
            return target
        intact = bool(expected) and read_digests(target) == expected
        if intact:  # a copy from an earlier job on this node: check it, in parallel
            names = sorted(expected)
            with ThreadPoolExecutor(STAGE_THREADS) as pool:
                found = list(pool.map(lambda n: _digest_or_none(target / n), names))
            intact = found == [expected[n] for n in names]
        if not intact:
            _copy_verified(folder, target, expected, var)
        if expected and job:
            mark = {"job": job, "digests": expected, "stats": _stats(target)}
            (target / VERIFIED).write_text(json.dumps(mark), encoding="utf-8")
    return target


def _digest_or_none(path: Path) -> str | None:
    return file_digest(path) if path.is_file() else None
