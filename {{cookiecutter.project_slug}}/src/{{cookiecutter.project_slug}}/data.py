"""Processed data: written all-or-nothing by `prepare`, verified and staged for training.

`prepare` runs the task's `prepare` into a temporary folder beside `data/processed/<task>`,
records the SHA-256 of every file it wrote in `SHA256SUMS`, and only then swaps the folder in:
a failed or interrupted `prepare` leaves the previous processed data untouched.

Inside a job, `stage` copies that folder once per node to node-local disk (named by the
environment variable `data.node_tmp_var`): parallel file systems are slow for many small reads
from many GPUs, node-local disks are fast. The copy is checked against `SHA256SUMS`, so a stale
or damaged copy is never used. Data read in place is checked too, with the sums cached by
file metadata (as for the raw data), so a repeated start reads no data to check it.

A run records `processed_digest`, the SHA-256 of `SHA256SUMS`, in its checkpoints: a resume
on processed data that `prepare` has changed since (another split, other files) is refused.
"""

import hashlib
import os
import shutil
import sys
from pathlib import Path

from .config import Config
from .errors import DataError
from .hashcache import HashCache
from .task import Task

DIGESTS = "SHA256SUMS"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != DIGESTS)


def write_digests(folder: Path) -> None:
    """Record `<sha256>  <relative path>` of every file in `folder`."""
    lines = [f"{_sha256(p)}  {p.relative_to(folder).as_posix()}\n" for p in _files(folder)]
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


def check_same_data(saved: str | None, now: str | None, run: str, folder: Path) -> None:
    """Refuse a resume on processed data other than the run's (None saved: not recorded)."""
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
        actual = cache.get(name, st) or _sha256(path)
        if actual != digest:
            raise DataError(
                f"{path} does not match {folder / DIGESTS}: it changed after prepare; "
                "run prepare again"
            )
        cache.put(name, st, actual)
    cache.save()


def prepare(task: Task) -> str:
    """Run the task's `prepare` and swap the result in as `task.processed_dir`."""
    target = task.processed_dir
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        line = task.prepare(tmp)
        write_digests(tmp)
        if target.exists():
            target.rename(old)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return line


def stage(folder: Path, cfg: Config, local_rank: int) -> Path:
    """Inside a job, the node-local copy of `folder` (made by local rank 0); else `folder`.

    Either is checked against `SHA256SUMS` by local rank 0. The caller runs a barrier before
    the other ranks read the data.
    """
    node_tmp = os.environ.get(cfg.data.node_tmp_var, "")
    if not folder.is_dir():
        return folder
    if not cfg.data.stage_to_node_tmp or not node_tmp or not Path(node_tmp).is_dir():
        if local_rank == 0 and cfg.data.stage_to_node_tmp and os.environ.get("SLURM_JOB_ID"):
            print(
                f"note: ${cfg.data.node_tmp_var} is not a folder here: reading {folder} from "
                "the shared file system (slower); set data.node_tmp_var to stage it",
                file=sys.stderr,
            )
        if local_rank == 0:
            verify(folder)
        return folder
    target = Path(node_tmp) / "processed" / folder.name
    if local_rank == 0:
        expected = read_digests(folder)
        if not expected or read_digests(target) != expected:
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(folder, tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            print(f"staged {folder} -> {target}", file=sys.stderr)
        for name, digest in expected.items():
            copied = target / name
            if not copied.is_file() or _sha256(copied) != digest:
                raise DataError(
                    f"{folder / name} does not match {folder / DIGESTS}: it changed after "
                    "prepare; run prepare again"
                )
    return target
