"""Writing and reading the training state with every process, in the foreground or background.

`ddp`: the state is the same in every process, so rank 0 writes one `step-<N>.pt` file (one
writer is as fast as several for replicated data, and one file loads memory-mapped). `fsdp`:
each process holds a different part, so every process writes its shards in parallel with
torch.distributed.checkpoint (DCP) into `.step-<N>.dcp.tmp/`, which rank 0 renames to
`step-<N>.dcp` once every file is written and its checksum recorded. DCP stores tensors by
parameter name and slice, so a run can resume with another number of processes.

Waiting for another rank's reading or writing happens in the untimed I/O group
(`distributed.io_group`), never in a collective under `dist.timeout_minutes`: a slow disk makes
a checkpoint slow, not the run dead. A background save (`run.async_checkpoint`) first copies
the state into host buffers kept from save to save (`stager`) and then writes while training
goes on; at most one is in flight, and every other use of the I/O group waits
for it first. A background save that falls due while the previous one is still being written
is skipped (`skip`), said once: waiting for the disk would hold training for the rest of the
write at every save.
"""

import math
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ...errors import CheckpointError, NoIntactCheckpointError, first_line
from ..parallel import distributed
from ..parallel.distributed import DistEnv
from . import checkpoint, shard_files

# Types only: the strategy is handed in. It imports this wing (to read weights into a model),
# so an import back would be a circle; of the parallel wing, only `distributed` is imported.
if TYPE_CHECKING:
    from ..parallel.strategy import Stepped, Strategy


def slow_save(save_s: float, every_s: float, grace_s: float) -> dict[str, str]:
    """What is wrong with a save of `save_s` seconds: {"interval": ..., "grace": ...}, or {}.

    One rule for `plan` (a predicted save) and the run (a measured one). A save should take at
    most half the time between checkpoints (`every_s`, 0 for none by time), else training
    spends much of its time saving (or skips background saves), and at most half the stop
    grace (`grace_s`, 0 when unknown), else the stop's save may be cut off at the limit.
    """
    problems = {}
    if 0 < every_s < 2 * save_s:
        problems["interval"] = (
            f"run.checkpoint_every_minutes={every_s / 60:g} is close to a save ({_s(save_s)} s): "
            "training would spend much of its time saving; raise it"
        )
    if 0 < grace_s < 2 * save_s:
        problems["grace"] = (
            f"a save takes about {_s(save_s)} s, and the stop signal comes {_s(grace_s)} s "
            "before the limit"
        )
    return problems


def _s(seconds: float) -> str:
    """Seconds for a message: whole from 10 s on, else two significant digits."""
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.2g}"


def _grace_s() -> float:
    """Seconds from the stop signal to the time limit (0 outside a job).

    STOP_GRACE_S, set by the job script (slurm/common.sh) for each segment.
    """
    try:
        return max(0.0, float(os.environ.get("STOP_GRACE_S", "0")))
    except ValueError:
        return 0.0


def stager(device: torch.device) -> DefaultStager:
    """What copies the state off the device for a background save: DCP's `DefaultStager`.

    Into host buffers kept from save to save (DTensor shards included), page-locked (pinned)
    for a GPU, whose copies are queued without waiting for each, then waited for once. The
    same design held training 0.02 s for 0.75 GiB of state on an H200 (0.28 s on the first
    save, which allocates the buffers), against 0.54 s for pageable copies one at a time. The
    buffers hold one host copy of this process's state for the rest of the run; they are
    rewritten only after the previous save has finished (`Checkpointer.save`).
    """
    cuda = device.type == "cuda"
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,  # the writer is a thread of this process
            use_async_staging=False,  # training goes on once the copy is done
            use_non_blocking_copy=cuda,
        )
    )


class Checkpointer:
    """Saves and loads the checkpoints of one run (every rank has one)."""

    def __init__(
        self,
        directory: Path,
        strategy: "Strategy",
        denv: DistEnv,
        keep: int,
        say: Callable[[str], None],
        *,
        every_s: float = 0.0,
    ) -> None:
        """Nothing is read or written yet; `run_id` is set before the first save or load.

        `every_s`: the seconds between checkpoints (run.checkpoint_every_minutes), to judge
        the saves against (`slow_save`), with the stop grace of the job.
        """
        self.directory, self.strategy, self.denv, self.keep, self.say = (
            directory,
            strategy,
            denv,
            keep,
            say,
        )
        self.run_id = ""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future[Any] | None = None
        self._stager = stager(strategy.device)
        self.skipped = 0  # background saves skipped while the previous one was still writing
        self.every_s, self.grace_s = every_s, _grace_s()
        self._judged = False  # a slow save is said once

    # --- saving -----------------------------------------------------------------------
    def save(
        self,
        step: int,
        net: nn.Module,
        stepped: "Stepped",
        extra: dict[str, Any],
        background: bool,
    ) -> None:
        """Write the checkpoint of `step`: the strategy's state plus `extra` (all ranks)."""
        self.wait()  # one save at a time, in order
        started = time.perf_counter()
        if self.strategy.sharded:
            self._save_shards(step, net, stepped, extra, background, started=started)
            return
        if self.denv.is_main:
            state = {**self.strategy.state(net, stepped), **extra}
            if background:
                staged = self._stager.stage(state)
                self._pending = self._pool.submit(self._write, staged, step, started)
            else:
                self._write(state, step, started)
        if not background:
            distributed.barrier(io=True)

    def _write(self, state: dict[str, Any], step: int, started: float) -> None:
        checkpoint.save(state, self.directory, step, self.keep, run_id=self.run_id, started=started)
        self._judge(time.perf_counter() - started)

    def _save_shards(
        self,
        step: int,
        net: nn.Module,
        stepped: "Stepped",
        extra: dict[str, Any],
        background: bool,
        *,
        started: float,
    ) -> None:
        tmp = self.directory / f".step-{step:09d}.dcp.tmp"
        writer = shard_files.writer(tmp)  # each file's digest taken as it is written
        if self.denv.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a process killed while writing
            tmp.mkdir(parents=True)
            writer.fs.written["meta.pt"] = checkpoint.save_atomic(extra, tmp / "meta.pt")
        distributed.barrier(io=True)  # the folder exists before any rank writes into it
        tensors = self.strategy.state(net, stepped)
        if not self.denv.distributed:  # one process: DCP's own threads would warn about that
            if background:
                staged = self._stager.stage(tensors)
                self._pending = self._pool.submit(
                    self._write_alone, staged, writer, tmp, step, started
                )
            else:
                self._write_alone(tensors, writer, tmp, step, started)
            return
        io = distributed.io_group()
        if background:  # returns once the state is staged; the writing goes on in a thread
            written = dcp.async_save(
                tensors, storage_writer=writer, process_group=io, async_stager=self._stager
            )
            self._pending = self._pool.submit(self._seal, writer, tmp, step, started, written)
        else:
            dcp.save(tensors, storage_writer=writer, process_group=io)
            self._seal(writer, tmp, step, started)

    def _write_alone(
        self,
        tensors: dict[str, Any],
        writer: dcp.FileSystemWriter,
        tmp: Path,
        step: int,
        started: float,
    ) -> None:
        with checkpoint.alone():
            dcp.save(tensors, storage_writer=writer, no_dist=True)
        self._seal(writer, tmp, step, started)

    def _seal(
        self,
        writer: dcp.FileSystemWriter,
        tmp: Path,
        step: int,
        started: float,
        written: Any = None,
    ) -> None:
        """The manifest of every rank's files, then rank 0 renames the folder and prunes."""
        if written is not None:
            written.result()  # DCP's rank 0 writes its metadata after every rank's shards
        main = self.denv.is_main
        files = {
            name: digest
            for part in distributed.gather_objects(writer.fs.written, io=True)
            for name, digest in part.items()
        }
        if main:
            checkpoint.write_manifest(tmp, files, self.run_id, started)
            final = self.directory / f"step-{step:09d}.dcp"
            if final.exists():  # a damaged one of this step that the run resumed before
                checkpoint.remove(final)
            tmp.replace(final)
            checkpoint.fsync_dir(self.directory)
            checkpoint.prune(self.directory, step, self.keep)
            self._judge(time.perf_counter() - started)
        distributed.barrier(io=True)

    def _judge(self, seconds: float) -> None:
        """Say (once) what is wrong with a save of `seconds`: measured, or read on resume."""
        problems = slow_save(seconds, self.every_s, self.grace_s)
        if self._judged or not problems or not self.denv.is_main:
            return
        self._judged = True
        if interval := problems.get("interval"):
            self.say(f"warning: checkpoints: {interval}")
        if grace := problems.get("grace"):
            self.say(
                f"warning: checkpoints: {grace}: the stop's save may be cut off. Set STOP_GRACE "
                f"in .env to {math.ceil(2 * seconds + 30)} or more (seconds; the job script "
                "raises it only after a slow stop), or write runs to a faster file system"
            )

    def writing(self) -> bool:
        """Whether this process's background save is still being written."""
        return self._pending is not None and not self._pending.done()

    def skip(self, step: int, writing: bool) -> bool:
        """Whether to skip the background save due at `step`: yes while one is `writing`.

        `writing` must be the same on every rank (the trainer's step vote), so all skip the
        same saves. The first skip is said, with the settings that make saves less frequent.
        """
        if not writing:
            return False
        self.skipped += 1
        if self.skipped == 1:
            self.say(
                f"warning: the checkpoint due at step {step} is skipped: the previous background "
                "save is still being written (saves fall due faster than the disk takes them; "
                "later ones are skipped the same way, unsaid). Raise run.checkpoint_every_minutes "
                "or run.checkpoint_every_steps"
            )
        return True

    def wait(self) -> None:
        """Finish the background save in flight, if any (its errors are raised here)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def barrier(self) -> None:
        """Wait for the other ranks after one rank's file I/O (untimed; saves finished first)."""
        self.wait()
        distributed.barrier(io=True)

    def close(self) -> None:
        """Finish a background save, stop the writer thread and free the host buffers."""
        try:
            self.wait()
        finally:
            self._pool.shutdown()
            self._stager.close()

    # --- loading ----------------------------------------------------------------------
    def load_latest(self, net: nn.Module, stepped: "Stepped") -> dict[str, Any] | None:
        """The newest intact checkpoint of this run, its tensors read into a state for `net`.

        A damaged checkpoint is skipped with one line naming the file and the reason; when
        checkpoints exist but none is intact, NoIntactCheckpointError (the run must not silently
        start from scratch); a checkpoint of another run, CheckpointError.
        """
        self.wait()
        found = checkpoint.list_checkpoints(self.directory)
        for _, path in reversed(found):
            if (state := self._read(path, net, stepped)) is not None:
                return state
        if found:
            raise NoIntactCheckpointError(
                f"none of the {len(found)} checkpoint(s) in {self.directory} is intact (see the "
                "warnings above); not starting from scratch: restore a good copy, or move them "
                "away to start the run again"
            )
        return None

    def _agreed(self, problem: str | None) -> str | None:
        """The first rank's problem, on every rank (waits untimed: ranks may read for long)."""
        return next((p for p in distributed.gather_objects(problem, io=True) if p), None)

    def _read(self, path: Path, net: nn.Module, stepped: "Stepped") -> dict[str, Any] | None:
        problem = None
        try:
            manifest = checkpoint.read_manifest(path)
        except CheckpointError as err:
            problem = str(err)
        else:
            if manifest["run_id"] != self.run_id:
                raise CheckpointError(
                    f"{path} belongs to another run (id {manifest['run_id']}, this run's is "
                    f"{self.run_id}); move it away or use another run.name"
                )
            if manifest["seconds"]:  # said in the first lines of a resumed segment
                self._judge(manifest["seconds"])
            problem = checkpoint.damaged(path, manifest, self._checked_first(path, manifest))
        state = None
        if not (problem := self._agreed(problem)):
            try:
                state = self._load(path, manifest, net, stepped)
            except Exception as err:  # any unreadable content: the next one
                first = first_line(err)
                problem = first if first.startswith(str(path)) else f"{path}: {first}"
            problem = self._agreed(problem)
        if problem:
            self.say(f"warning: skipping a checkpoint: {problem}")
            return None
        return state

    def _checked_first(self, path: Path, manifest: dict[str, Any]) -> list[str]:
        """The files of checkpoint `path` this rank verifies before loading any of it.

        A file: its share of the files (rank 0 the one). A sharded checkpoint: only the small
        `meta.pt`; DCP's files are checked as they are read (`shard_files`), the disk read once.
        """
        if path.is_dir():
            return ["meta.pt"]
        return sorted(manifest["files"])[self.denv.rank :: self.denv.world_size]

    def _load(
        self, path: Path, manifest: dict[str, Any], net: nn.Module, stepped: "Stepped"
    ) -> dict[str, Any]:
        if not path.is_dir():
            return checkpoint.load(path)
        if not self.strategy.sharded:
            raise CheckpointError(
                f"{path} holds sharded state (dist.strategy = 'fsdp'); resume with fsdp"
            )
        meta: dict[str, Any] = torch.load(path / "meta.pt", weights_only=True)
        tensors = self.strategy.state(net, stepped)  # the shards this process holds
        io, solo = distributed.io_group(), not self.denv.distributed
        files = shard_files.reader(path, manifest, self.denv.rank, self.denv.world_size)
        try:
            with checkpoint.alone() if solo else nullcontext():
                dcp.load(tensors, storage_reader=files, process_group=io, no_dist=solo)
        except CheckpointException as err:  # every rank's failure (a BaseException): one line
            raise CheckpointError(files.problem or first_line(err)) from None
        return {**meta, **tensors}
