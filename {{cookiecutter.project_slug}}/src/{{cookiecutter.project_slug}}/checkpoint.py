"""Atomic checkpoint files: `checkpoints/step-<N>.pt`, the newest k kept.

A checkpoint is written to a temporary file in the same directory, flushed to disk and renamed
over its final name, so a process killed at any moment leaves either the complete new file or
none; the previous checkpoints are removed only after the new one is in place.
"""

import contextlib
import errno
import fcntl
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError, ConfigError

_NAME = re.compile(r"step-(\d+)\.pt")


def _fsync_dir(directory: Path) -> None:
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


@contextlib.contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir/.lock` for one job; a second job on the same run name stops with one line.

    The lock is a POSIX record lock (also honoured over NFS): the system releases it when the
    holder dies, so a killed job never leaves a stale lock behind. The file names the holder.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno == errno.ENOLCK:  # a file system without locks: carry on unprotected
                print(f"warning: cannot lock {path} ({err})", file=sys.stderr)
            else:
                holder = path.read_text(encoding="utf-8").strip() or "another process"
                raise ConfigError(
                    f"run.name: run directory {run_dir} is in use by {holder}; wait for it or "
                    "choose another run.name"
                ) from None
        job = os.environ.get("SLURM_JOB_ID")
        holder = f"{'job ' + job + ', ' if job else ''}pid {os.getpid()} on {socket.gethostname()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode() + b"\n", 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save `obj` to `path` so that `path` is never seen half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoint files in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := _NAME.fullmatch(p.name)) and p.is_file()  # a folder of that name is not one
    ]
    return sorted(found)


def save(state: dict[str, Any], directory: Path, step: int, keep: int) -> Path:
    """Write the checkpoint for `step`; keep it and the newest `keep` - 1 of earlier steps.

    Files of later steps are left alone: such a file is there when the run resumed from an
    earlier checkpoint because it would not load, and counting it could delete the new file.
    """
    path = directory / f"step-{step:09d}.pt"
    save_atomic(state, path)
    earlier = [old for old_step, old in list_checkpoints(directory) if old_step < step]
    for old in earlier[: max(0, len(earlier) - (keep - 1))]:
        old.unlink(missing_ok=True)
    return path


def remove_stale_tmp(directory: Path) -> None:
    """Delete temporary files left by a process killed while writing."""
    if directory.is_dir():
        for tmp in directory.glob(".step-*.pt.tmp-*"):
            tmp.unlink(missing_ok=True)


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU (tensors only; no arbitrary code is unpickled)."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def _load_or_warn(path: Path) -> dict[str, Any] | None:
    try:
        return load(path)
    except Exception as err:  # any unreadable file: the caller falls back to the previous one
        print(f"warning: skipping unreadable checkpoint {path}: {err}", file=sys.stderr)
        return None


def load_latest(directory: Path) -> dict[str, Any] | None:
    """Newest checkpoint that loads, or None when there is none (fresh start)."""
    for _, path in reversed(list_checkpoints(directory)):
        if (state := _load_or_warn(path)) is not None:
            return state
    return None


def load_model(model: nn.Module, weights: dict[str, Any], source: str) -> None:
    """Load `weights` into `model`, or one line that says what does not fit (no traceback)."""
    own = model.state_dict()
    missing = sorted(own.keys() - weights.keys())
    unexpected = sorted(weights.keys() - own.keys())
    shapes = [
        f"{k} {list(weights[k].shape)} vs {list(v.shape)}"
        for k, v in own.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = [
            f"missing {', '.join(missing[:3])}" if missing else "",
            f"unexpected {', '.join(unexpected[:3])}" if unexpected else "",
            f"shape {'; '.join(shapes[:3])}" if shapes else "",
        ]
        problems = "; ".join(p for p in parts if p)
        raise CheckpointError(
            f"{source}: weights do not fit the configured model ({problems}); "
            "was the model or task changed?"
        )
    model.load_state_dict(weights)
