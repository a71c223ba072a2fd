"""Checkpoint files: `checkpoints/step-<N>.pt` or `step-<N>.dcp/`, the newest k kept, verified.

A checkpoint is written under a temporary name in the same directory, flushed to disk and
renamed to its final name, so a process killed at any moment leaves either the complete new
checkpoint or none; the previous ones are removed only after the new one is in place. Each
has a manifest (`step-<N>.pt.json` beside the file, `manifest.json` in the folder) with the
digest of every file and the id of the run it belongs to: a damaged file is found before
anything of it is used. Writing a sharded checkpoint with several processes: checkpoint_io.py.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch
import xxhash
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
from torch.distributed.tensor import DTensor, distribute_tensor

from ...errors import CheckpointError, ConfigError

_NAME = re.compile(r"step-(\d+)\.(pt|dcp)")
MANIFEST = "manifest.json"

# Checkpoint files are checked with xxh3-128 (the `xxhash` package): 10-27 GB/s on one core,
# where SHA-256 does 0.8-1.5 GB/s and a node's disk takes 1.4 GB/s, so the digest never
# limits a save or a resume (docs/performance.md has the figures). It finds what
# happens to checkpoints (a cut, a flipped bit, a file from elsewhere); it is no defence
# against someone forging a file, which SHA-256 would not be either without a signature.
# Manifests of earlier releases hold SHA-256 sums and are still read.
DIGEST = "xxh3_128"
READ_THREADS = 4  # files of a checkpoint read (verified) at once
HOLDER_WAIT_S = 10.0  # the longest a refused job waits for the lock's holder to name itself
_ALGORITHMS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}


def hasher(algorithm: str = DIGEST) -> Any:
    """A new digest of `algorithm` (xxh3_128 or sha256): update(bytes), hexdigest()."""
    return _ALGORITHMS[algorithm]()


def file_digest(path: Path, algorithm: str = DIGEST) -> str:
    """The digest of a file with `algorithm` (xxh3_128 or sha256), read in 8 MiB pieces."""
    digest = hasher(algorithm)
    with path.open("rb") as f:
        while piece := f.read(8 << 20):
            digest.update(piece)
    return str(digest.hexdigest())


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (where the file system allows)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        # Some network and parallel file systems refuse fsync on a directory (EINVAL); the
        # rename is then as durable as that file system makes it, and the file itself is synced.
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def uncache(path: Path) -> None:
    """Drop the pages of checkpoint `path` (a file or folder) from the page cache.

    The next read then comes from the disk, as a resume on another node or days later does:
    for measuring loads (`plan`, the benchmarks). Written pages are dropped only once on the
    disk, which a save's fsync ensures. Not on systems without posix_fadvise (macOS): reads
    stay cached there.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for file in [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@contextlib.contextmanager
def lock_run_dir(run_dir: Path, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold `run_dir/.lock` for one job; a second job on the same run name stops with one line.

    The lock is a POSIX record lock (also honoured over NFS): the system releases it when the
    holder dies, so a killed job never leaves a stale lock behind. The file names the holder
    (Slurm job, PID, host) while it runs and is emptied when it ends, so a name found there by
    the next holder is one that died (kill -9, a lost node): it is taken over, said in a line.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    locked = False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except OSError as err:
            if err.errno == errno.ENOLCK:  # a file system without locks: carry on unprotected
                print(f"warning: cannot lock {path} ({err})", file=sys.stderr)
            else:
                holder = _named_holder(fd) or "another process"
                raise ConfigError(
                    f"run.name: run directory {run_dir} is in use by {holder}; wait for it or "
                    "choose another run.name"
                ) from None
        if gone := _holder(fd):
            say(
                f"note: run directory {run_dir} was held by {gone}, which ended without "
                "releasing it; taking it over"
            )
        job = os.environ.get("SLURM_JOB_ID")
        holder = f"{'job ' + job + ', ' if job else ''}pid {os.getpid()} on {socket.gethostname()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode() + b"\n", 0)
        yield
    finally:
        if locked:  # this process ends its hold (also by an error): nothing to take over
            os.ftruncate(fd, 0)
        os.close(fd)  # closing releases the lock


def _holder(fd: int) -> str:
    """The holder a lock file names (empty when none)."""
    return os.pread(fd, 512, 0).decode("utf-8", "replace").strip()


def _named_holder(fd: int) -> str:
    """The name of a lock's live holder, which writes it just after taking the lock.

    Read until it is there (an array's tasks start together, and the second may look in
    between), for at most HOLDER_WAIT_S on a loaded machine; empty when it never came.
    """
    deadline = time.monotonic() + HOLDER_WAIT_S
    while not (holder := _holder(fd)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return holder


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Around a DCP call in one process, which DCP warns about; here that is on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*unavailable")
        yield


def run_id(run_dir: Path) -> str:
    """The id of the run in `run_dir` (made on its first start): checkpoints record it."""
    path = run_dir / "run_id"
    if not path.is_file():
        path.write_text(uuid.uuid4().hex + "\n", encoding="utf-8")
    return path.read_text(encoding="utf-8").strip()


class DigestingFile:
    """A binary file that computes the digest (DIGEST) of what is written through it.

    What torch.save and DCP's writer use of a file: write, tell, flush, fileno, close.
    """

    def __init__(self, f: IO[bytes]) -> None:
        """Wrap the open file `f`."""
        self.f, self.digest = f, hasher()

    def write(self, data: bytes) -> int:
        """Write `data`, adding it to the digest."""
        self.digest.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        """The position in the file."""
        return self.f.tell()

    def flush(self) -> None:
        """Flush the file's buffer."""
        self.f.flush()

    def fileno(self) -> int:
        """The file's descriptor (for fsync)."""
        return self.f.fileno()

    def close(self) -> None:
        """Close the file."""
        self.f.close()

    def hexdigest(self) -> str:
        """The digest of everything written so far."""
        return str(self.digest.hexdigest())


def without_zip_crc() -> contextlib.AbstractContextManager[Any]:
    """torch.save without its per-record CRC-32 (one thread, about 4 GB/s: a fifth of a save).

    The checkpoint's own digest covers the same bytes. torch keeps the switch in a context
    variable: it holds for the thread that turns it off (each of DCP's writer threads does, as
    it opens its file), not for the others. torch before 2.6 has no such switch and keeps
    computing it.
    """
    try:
        from torch.utils.serialization import config  # noqa: PLC0415  (torch 2.6+)
    except ImportError:
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})  # type: ignore[no-any-return]


def _write(obj: Any, tmp: Path) -> str:
    """torch.save `obj` to `tmp`, flushed to disk; its digest, computed while writing."""
    with tmp.open("wb") as f, without_zip_crc():
        out = DigestingFile(f)  # no second read of a large file
        torch.save(obj, out)
        f.flush()
        os.fsync(f.fileno())
    return out.hexdigest()


def save_atomic(obj: Any, path: Path) -> str:
    """torch.save `obj` to `path` so that `path` is never seen half-written; its digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        digest = _write(obj, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return digest


def manifest_path(path: Path) -> Path:
    """Where the manifest of the checkpoint `path` lives: inside a folder, beside a file."""
    return path / MANIFEST if path.is_dir() else path.with_name(f"{path.name}.json")


def write_manifest(path: Path, files: dict[str, str], run_id: str, started: float) -> None:
    """Record the run, each file's digest and the save's seconds for checkpoint `path`, atomically.

    `started`: when the save began (time.perf_counter).
    """
    target = manifest_path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    seconds = round(time.perf_counter() - started, 3)
    record = {"run_id": run_id, "seconds": seconds, DIGEST: dict(sorted(files.items()))}
    text = json.dumps(record, indent=1)
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(target)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the checkpoint `path`: run_id, algorithm, files and seconds.

    files: {name: digest}, under the algorithm's name in the file; seconds: how long the save
    took (None in manifests of earlier releases). CheckpointError naming what is wrong.
    """
    where = manifest_path(path)
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
        algorithm = next((name for name in _ALGORITHMS if name in manifest), DIGEST)
        files, run_id = manifest[algorithm], manifest["run_id"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{where}: no readable checksum record ({err})") from None
    seconds = manifest.get("seconds")
    if (
        not isinstance(files, dict)
        or not isinstance(run_id, str)
        or not isinstance(seconds, float | int | None)
    ):
        raise CheckpointError(f"{where}: malformed checksum record")
    return {"run_id": run_id, "algorithm": algorithm, "files": files, "seconds": seconds}


def damaged(path: Path, manifest: dict[str, Any], names: list[str] | None = None) -> str | None:
    """The first file of checkpoint `path` whose content changed, with why; None if intact.

    `names`: the files to check (default: every file the manifest lists). They are read in
    parallel (READ_THREADS): a sharded checkpoint's files are read at the disk's speed, not
    at one stream's.
    """
    folder = path if path.is_dir() else path.parent
    files = manifest["files"]

    def check(name: str) -> str | None:
        file = folder / name
        try:
            actual = file_digest(file, manifest["algorithm"])
        except OSError as err:
            return f"{file}: unreadable ({err.strerror or err})"
        if actual != files[name]:
            return f"{file}: checksum mismatch (damaged or changed after it was written)"
        return None

    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="verify") as pool:
        found = pool.map(check, sorted(files) if names is None else names)
        return next((problem for problem in found if problem), None)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in `directory`, oldest first.

    `step-<N>.pt` files (one process wrote the whole state) and `step-<N>.dcp` folders (each
    process wrote its shards, torch.distributed.checkpoint).
    """
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        # a folder named .pt or a file named .dcp is not one
        if (m := _NAME.fullmatch(p.name)) and (p.is_dir() if m.group(2) == "dcp" else p.is_file())
    ]
    return sorted(found)


def remove(path: Path) -> None:
    """Delete a checkpoint file with its manifest, or a checkpoint folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        manifest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def prune(directory: Path, step: int, keep: int) -> None:
    """Keep the checkpoint of `step` and the newest `keep` - 1 of earlier steps.

    Checkpoints of later steps are left alone: such a one is there when the run resumed from
    an earlier checkpoint because it would not load, and counting it could delete the new one.
    """
    earlier = [old for old_step, old in list_checkpoints(directory) if old_step < step]
    for old in earlier[: max(0, len(earlier) - (keep - 1))]:
        remove(old)


def save(
    state: dict[str, Any],
    directory: Path,
    step: int,
    keep: int,
    *,
    run_id: str = "",
    started: float = 0.0,
) -> Path:
    """Write the one-file checkpoint for `step` with its manifest; prune older ones.

    `started`: when the save began (time.perf_counter; default now), for the manifest's seconds.
    """
    started = started or time.perf_counter()
    path = directory / f"step-{step:09d}.pt"
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        digest = _write(state, tmp)
        # The manifest first, then the file under its final name: a listed file always has
        # its manifest; a manifest without its file (a kill in between) is removed on resume.
        write_manifest(path, {path.name: digest}, run_id, started)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(directory)
    prune(directory, step, keep)
    return path


def remove_stale_tmp(directory: Path) -> None:
    """Delete what a process killed while writing left: temporary files, folders, manifests."""
    if not directory.is_dir():
        return
    for tmp in directory.glob(".step-*"):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    for manifest in directory.glob("step-*.pt.json"):
        if not manifest.with_suffix("").exists():
            manifest.unlink(missing_ok=True)


def load(path: Path) -> dict[str, Any]:
    """Read a whole checkpoint onto the CPU (tensors only; no arbitrary code is unpickled).

    A file is memory-mapped: tensors are read from disk when used, so a large checkpoint does
    not first take its size in memory on every process. A sharded (`.dcp`) checkpoint is
    assembled into whole tensors, for evaluation and inspection in one process.
    """
    if path.is_dir():
        state: dict[str, Any] = torch.load(path / "meta.pt", weights_only=True)
        with alone():  # every tensor, whole (DCP's loader for one process without a model)
            tensors = _load_state_dict_from_keys(checkpoint_id=path)
        return {**state, **tensors}
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # type: ignore[no-any-return]


def _load_or_warn(path: Path) -> dict[str, Any] | None:
    try:
        if problem := damaged(path, read_manifest(path)):
            raise CheckpointError(problem)
        return load(path)
    except Exception as err:  # any unreadable file: the caller falls back to the previous one
        print(f"warning: skipping a checkpoint: {err}", file=sys.stderr)
        return None


def load_latest(directory: Path) -> dict[str, Any] | None:
    """Newest checkpoint that is intact and loads, or None when there is none (one process)."""
    for _, path in reversed(list_checkpoints(directory)):
        if (state := _load_or_warn(path)) is not None:
            return state
    return None


def misfit(
    source: str, missing: list[str], unexpected: list[str], shapes: list[str]
) -> CheckpointError:
    """The one-line error for weights that do not fit a model: the first few of each kind."""
    parts = [
        f"missing {', '.join(missing[:3])}" if missing else "",
        f"unexpected {', '.join(unexpected[:3])}" if unexpected else "",
        f"shape {'; '.join(shapes[:3])}" if shapes else "",
    ]
    return CheckpointError(
        f"{source}: weights do not fit the configured model "
        f"({'; '.join(p for p in parts if p)}); was the model or task changed?"
    )


def load_model(
    model: nn.Module, weights: dict[str, Any], source: str, skip: Collection[str] = ()
) -> None:
    """Load `weights` into `model`, or one line that says what does not fit (no traceback).

    `skip`: frozen parameters the weights leave out on purpose (checked by digest instead).
    """
    own = model.state_dict()
    missing = sorted(own.keys() - weights.keys() - set(skip))
    unexpected = sorted(weights.keys() - own.keys())
    shapes = [
        f"{k} {list(weights[k].shape)} vs {list(v.shape)}"
        for k, v in own.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        raise misfit(source, missing, unexpected, shapes)
    # A sharded model (fsdp) takes each process's slice of a whole tensor, cut locally: with
    # a memory-mapped file only that slice is read, and no rank needs a full copy in memory.
    weights = {
        k: distribute_tensor(w, own[k].device_mesh, own[k].placements, src_data_rank=None)
        if isinstance(own.get(k), DTensor) and not isinstance(w, DTensor)
        else w
        for k, w in weights.items()
    }
    model.load_state_dict(weights, strict=not skip)
