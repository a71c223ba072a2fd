"""Evidence for when a run goes wrong: allocator and NCCL settings, profiler trace, OOM snapshot.

On by default where it costs nothing until something fails: the CUDA allocator's expandable
segments (less fragmentation, fewer out-of-memory errors on changing shapes), NCCL's flight
recorder (the last collectives of every rank, written into the run directory when a
collective times out), and a memory snapshot when CUDA runs out of memory. `run.debug=true`
adds what costs something: NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL (verbose logs,
extra collective checks) and the allocation history with stack traces in the OOM snapshot.
`run.profile_steps=N` writes a torch profiler trace of N steps (open it in Perfetto or
chrome://tracing). A variable already set in the environment is never overridden.
"""

import errno
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

EXIT_TRANSIENT = 75
"""Exit code of `train` after a distributed failure worth a relaunch (EX_TEMPFAIL of sysexits.h).

The job script relaunches the training on it (RETRIES, slurm/common.sh); it resumes from the
last checkpoint.
"""

# torch.save's messages for a write that failed inside its zip writer.
TORCH_WRITE_FAILED = re.compile(r"PytorchStreamWriter failed|file write failed|unexpected pos")
# Less free space than this (bytes) after a failed write: the disk is full.
FULL_BELOW = 64 * 2**20

# Flight recorder entries per rank: a few thousand collectives cost a few MB of host memory.
TRACE_ENTRIES = 2000


def rank(env: Mapping[str, str] = os.environ) -> str:
    """This process's global rank as the launcher tells it (0 when started alone)."""
    return env.get("RANK") or env.get("SLURM_PROCID") or "0"


def _torch_release() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def settings_for(run_dir: Path, debug: bool) -> dict[tuple[str, ...], str]:
    """The variables of these diagnostics for a run writing into `run_dir`: names -> value.

    Each key lists the names of one setting, the one to set first, then the other names torch
    reads for it. torch 2.11 renamed the flight recorder's TORCH_NCCL_TRACE_BUFFER_SIZE and
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE to TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE and
    warns on every rank about the old names; older releases know only those.
    """
    renamed = _torch_release() >= (2, 11)
    buffer = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    prefix = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    values = {
        # PYTORCH_ALLOC_CONF is the newer name; the old one is read by every torch >= 2.4.
        ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"): "expandable_segments:True",
        buffer if renamed else buffer[::-1]: str(TRACE_ENTRIES),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT",): "1",
        # One file per rank: this prefix followed by the rank.
        prefix if renamed else prefix[::-1]: str(run_dir / "nccl-trace-rank-"),
    }
    if debug:
        values |= {("NCCL_DEBUG",): "INFO", ("TORCH_DISTRIBUTED_DEBUG",): "DETAIL"}
    return values


def configure(run_dir: Path, debug: bool, env: MutableMapping[str, str] = os.environ) -> list[str]:
    """Set each setting of `settings_for` that the environment leaves unset; return the names set.

    Call it before CUDA and the process group start: both read them once.
    """
    applied = []
    for names, value in settings_for(run_dir, debug).items():
        if not any(name in env for name in names):
            env[names[0]] = value
            applied.append(names[0])
    return applied


def write_failure(err: BaseException, folder: Path) -> OSError | None:
    """A full disk while writing into `folder`, as an OSError naming it; None for other errors.

    torch.save reports a failed write to a path as a RuntimeError of its zip writer ("unexpected
    pos", "file write failed") that names neither the file nor the reason, and a write to an
    open file as an OSError without a file name: either way the user learns neither where nor
    why. The free space of the folder's file system tells a full disk from other failures.
    """
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return None if err.filename else OSError(err.errno, err.strerror, str(folder))
    if not isinstance(err, RuntimeError) or not TORCH_WRITE_FAILED.search(str(err)):
        return None
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if shutil.disk_usage(existing).free < FULL_BELOW:
        return OSError(errno.ENOSPC, "No space left on device (writing a checkpoint)", str(folder))
    first = str(err).strip().splitlines()[0]
    return OSError(errno.EIO, f"writing a checkpoint failed (a full quota?): {first}", str(folder))


def is_transient(err: BaseException) -> bool:
    """Whether `err` is a distributed failure a relaunch may not meet again (NCCL, the store)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    return isinstance(err, RuntimeError) and "NCCL" in str(err)


@contextmanager
def profile_steps(steps: int, run_dir: Path) -> Iterator[None]:
    """Record a profiler trace of `steps` optimizer steps (after one warm-up step) into `run_dir`.

    The steps are counted by a hook on every optimizer's step, so the training loop needs no
    change. Writes `profile-rank<R>.json` (a Chrome trace) when the steps are done, or at the
    end of a shorter run.
    """
    if steps <= 0:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    path = run_dir / f"profile-rank{rank()}.json"

    def save(prof: torch.profiler.profile) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        print(f"profiler trace of {steps} step(s): {path}", flush=True)

    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=save,
    )
    hook = register_optimizer_step_post_hook(lambda *_args: profiler.step())
    profiler.start()
    try:
        yield
    finally:
        hook.remove()
        profiler.stop()


@contextmanager
def snapshot_on_oom(run_dir: Path, debug: bool) -> Iterator[None]:
    """On CUDA out-of-memory, write the allocator's state into `run_dir`, then re-raise.

    With `debug` the allocation history (with stack traces) is recorded from the start, which
    costs time on every allocation; without it the snapshot still shows every segment and block.
    """
    recording = debug and torch.cuda.is_available()
    if recording:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
    except torch.OutOfMemoryError:
        path = run_dir / f"memory-snapshot-rank{rank()}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        print(
            f"CUDA out of memory: allocator snapshot in {path} (drag it onto "
            "https://pytorch.org/memory_viz)"
            + ("" if debug else "; run.debug=true adds the allocation history"),
            file=sys.stderr,
        )
        raise
    finally:
        if recording:
            torch.cuda.memory._record_memory_history(enabled=None)


@contextmanager
def session(run_dir: Path, debug: bool, steps: int) -> Iterator[None]:
    """Everything above around one training run (run.debug, run.profile_steps)."""
    configure(run_dir, debug)
    with snapshot_on_oom(run_dir, debug), profile_steps(steps, run_dir):
        yield
