"""Provenance: which code, data and machine produced a run, recorded at every start.

Each start of a run (the first and every resumed segment) appends one JSON line to
`runs/<run>/provenance.jsonl`: the git commit and whether the working tree had uncommitted
changes, the SHA-256 of the raw-data manifest (the data freeze) and of the processed data's
`SHA256SUMS` (what `prepare` made of it), the Slurm job, array task,
restart and nodes, and the versions of Python and the key packages. A result can then be
traced to code and data even when a requeued segment ran other code than the first one.
Rank 0 writes it; nothing here may stop a run (a missing git or manifest is recorded as null).
"""

import datetime
import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from ..data.manifest import PROGRAM
from ..data.rawdata import MANIFEST_PATH

FILE_NAME = "provenance.jsonl"
PACKAGES = ("torch", "numpy", "matplotlib", "tensorboard", "__package__")
SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_PARTITION",
    "SLURM_CLUSTER_NAME",
)


def _git(root: Path, *args: str) -> str | None:
    """Output of one git command in `root`, or None without git or a repository."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed arguments, no shell
            ["git", "-C", str(root), *args],  # noqa: S607 - git from PATH, as the user runs it
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_state(root: Path) -> dict[str, Any]:
    """The commit of `root` and whether tracked or untracked files differ from it."""
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def file_digest(path: Path) -> str | None:
    """SHA-256 of a file's bytes, or None when it does not exist."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Python and the installed versions of the packages that shape a result."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        dist = PROGRAM if name == "__package__" else name
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def record(
    run_dir: Path,
    project_root: Path,
    env: Mapping[str, str],
    processed: str | None = None,
    step: int = 0,
) -> dict[str, Any]:
    """Append this start's provenance to `run_dir/provenance.jsonl`; return the record.

    `processed` is the SHA-256 of the processed data's `SHA256SUMS` (None: no prepared data);
    `step` the optimizer step this start begins at (above 0: it resumed there).
    """
    entry = {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "step": step,
        **code_state(project_root),
        "raw_manifest_sha256": file_digest(project_root / MANIFEST_PATH),
        "processed_sha256": processed,
        "slurm": {name: env[name] for name in SLURM_VARIABLES if name in env},
        "host": platform.node(),
        "versions": versions(),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / FILE_NAME).open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return entry


def resumed_at(run_dir: Path) -> list[int]:
    """The steps at which the run resumed, from its starts' records (a damaged line: skipped)."""
    steps = []
    try:
        lines = (run_dir / FILE_NAME).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int) and step > 0:
            steps.append(step)
    return steps
