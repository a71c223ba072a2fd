"""Process-group set-up for one process, torchrun, or `srun` with one task per GPU.

The launch mode is read from the environment: torchrun sets RANK/LOCAL_RANK/WORLD_SIZE; `srun`
sets SLURM_PROCID/SLURM_LOCALID/SLURM_STEP_NUM_TASKS. Under srun the rendezvous address is the
first host of SLURM_JOB_NODELIST, parsed here in Python because `scontrol` is often missing
inside containers, and the port is derived from the job id so every rank computes the same one
without talking to the others (`rendezvous_port`).
"""

import datetime
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits among all processes of the run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    launcher: str = "single"  # single | torchrun | slurm

    @property
    def is_main(self) -> bool:
        """Rank 0 does the side effects: logs, figures, checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets: `a[1,2],b` -> [`a[1,2]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list, e.g. `gpu[01-03,7],login1` (zero padding kept)."""
    hosts: list[str] = []
    for part in _split_top_level(nodelist):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                # Recursion handles a second bracket group such as `n[1-2]-ib[0-1]`.
                hosts.extend(expand_nodelist(f"{prefix}{number:0{width}d}{suffix}"))
    return hosts


# Rendezvous ports: 10000-29999, below Linux's ephemeral range (32768 and up), where the
# kernel hands out ports for outgoing connections. Ten ports per job id, from the id modulo
# 2000: SLURM_JOB_ID is unique per job and per array task (tasks get consecutive ids), so
# jobs sharing a node collide only if their ids differ by a multiple of 2000. Within a job,
# ports 0-4 go round with the restart count (clear of sockets an earlier attempt left
# behind) and 5 is torchrun's agent (slurm/common.sh computes the same, a test checks).
PORT_BASE = 10_000
PORT_JOB_SLOTS = 2_000
PORTS_PER_JOB = 10
PORT_RESTART_SLOTS = 5


def rendezvous_port(job_id: int, restart_count: int) -> int:
    """The port of one job and attempt under the srun launcher (see the rule above)."""
    slot = (job_id % PORT_JOB_SLOTS) * PORTS_PER_JOB
    return PORT_BASE + slot + restart_count % PORT_RESTART_SLOTS


def rendezvous(env: Mapping[str, str]) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: from the environment, else derived from Slurm's variables."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    addr = env.get("MASTER_ADDR") or expand_nodelist(nodelist)[0]
    if env.get("MASTER_PORT"):
        return addr, int(env["MASTER_PORT"])
    job = int(env.get("SLURM_JOB_ID") or 0)
    return addr, rendezvous_port(job, int(env.get("SLURM_RESTART_COUNT") or 0))


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """This node's entry of Slurm's tasks-per-node list: `3,2` or `2(x3),1` (= 2,2,2,1)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"unexpected Slurm tasks-per-node list {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise ValueError(f"SLURM_NODEID {node_id} is not a node of {tasks_per_node!r}")
    return counts[node_id]


def resolve_env(env: Mapping[str, str] | None = None) -> DistEnv:
    """Read this process's rank from torchrun's or srun's variables (single process otherwise)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=world,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
            launcher="torchrun",
        )
    # SLURM_STEP_NUM_TASKS exists only inside an srun step, not in the batch script itself,
    # where SLURM_NTASKS alone would make a lone `python` process wait for absent peers.
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        world = int(env["SLURM_STEP_NUM_TASKS"])
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        node_id = int(env.get("SLURM_NODEID") or 0)
        local_world = tasks_on_node(tasks_per_node, node_id) if tasks_per_node else world
        if world > 1:
            return DistEnv(
                rank=int(env["SLURM_PROCID"]),
                local_rank=int(env.get("SLURM_LOCALID", 0)),
                world_size=world,
                local_world_size=local_world,
                launcher="slurm",
            )
    return DistEnv()


# Waiting for another rank's file I/O (checkpoint save and load, data staging) happens in a
# second, gloo group with this timeout instead of dist.timeout_minutes: a slow disk must make a
# run slow, never dead. Longer than any partition's time limit on purpose: a rank that is truly
# stuck is ended by the job's limit, and one that dies ends the step through srun
# (--kill-on-bad-exit) or torchrun, so nothing waits forever. A monitored barrier would still
# time out; a plain untimed store wait would need the private default store.
IO_TIMEOUT = datetime.timedelta(days=7)
_io_group: Any = None
_vote_group: Any = None  # the stop vote's alone: collectives on a group must run in one order


def init(denv: DistEnv, device: torch.device, backend: str, timeout_minutes: float) -> None:
    """Join the process group (no-op for a single process). Call set_device before this."""
    global _io_group, _vote_group  # noqa: PLW0603  (one per process, like the default group)
    if not denv.distributed:
        return
    if denv.launcher == "slurm":
        addr, port = rendezvous(os.environ)
        os.environ.setdefault("MASTER_ADDR", addr)
        os.environ.setdefault("MASTER_PORT", str(port))
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=denv.rank,
        world_size=denv.world_size,
        timeout=datetime.timedelta(minutes=timeout_minutes),
        device_id=device if device.type == "cuda" else None,
    )
    _io_group = dist.new_group(backend="gloo", timeout=IO_TIMEOUT)
    # Untimed like the I/O group: a vote is answered once every rank has finished its step,
    # which may include a slow save; a rank that dies ends the job through the launcher.
    _vote_group = dist.new_group(backend="gloo", timeout=IO_TIMEOUT)


def io_group() -> Any:
    """The process group that waits for file I/O without a short timeout (None: one process)."""
    return _io_group


def shutdown() -> None:
    """Leave the process group if one was joined."""
    global _io_group, _vote_group  # noqa: PLW0603
    _io_group = _vote_group = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _active() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def barrier(io: bool = False) -> None:
    """Wait for all ranks (no-op without a process group); `io`: after file I/O, untimed."""
    if _active():
        dist.barrier(group=_io_group if io else None)


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    """Element-wise: true on every rank where true on at least one rank (one all-reduce)."""
    if not _active():
        return flags
    tensor = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


class StepVote:
    """Flags every rank agrees on, one step late, without a blocking collective per step.

    Each `poll` starts a non-blocking all-reduce (MAX) of this rank's flags on a gloo group of
    its own, on the host (no GPU sync), and returns the result of the previous poll's, which
    every rank ran at the same step: so all ranks act on a flag at the same step, at most one
    step after any rank raised it. The wait is short: the step in between already kept the
    ranks together. One process: the flags themselves, at once.
    """

    def __init__(self) -> None:
        """No vote in flight yet."""
        self._pending: tuple[torch.Tensor, Any] | None = None

    def poll(self, flags: list[bool]) -> list[bool]:
        """The previous poll's flags, OR-ed over all ranks; this poll's are sent off."""
        if _vote_group is None:
            return flags
        agreed = [False] * len(flags)
        if self._pending is not None:
            tensor, work = self._pending
            work.wait()
            agreed = [bool(v) for v in tensor.tolist()]
        tensor = torch.tensor([int(f) for f in flags])
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_vote_group, async_op=True)
        self._pending = tensor, work
        return agreed

    def settle(self) -> None:
        """Wait for the vote in flight (every rank has sent it) before the group goes away."""
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None


def sum_tensors(
    sums: dict[str, torch.Tensor], denv: DistEnv, device: torch.device
) -> dict[str, torch.Tensor]:
    """Each tensor summed over the ranks of `denv` (floats in float64, in sorted key order).

    A single-process `denv` inside a multi-process run (one rank alone, e.g. `evaluate`) sums
    nothing: an all-reduce no other rank joins would fail or hang.
    """
    out = {k: v.double() if v.is_floating_point() else v for k, v in sorted(sums.items())}
    if denv.distributed and _active():
        for key, value in out.items():
            out[key] = value.to(device)
            dist.all_reduce(out[key])
    return out


def all_ranks(flag: bool) -> bool:
    """True where `flag` is true on every rank: a blocking vote on the host's gloo group.

    No GPU sync; a sharded evaluation of streams uses it to stop on the same batch everywhere.
    """
    return not most(int(not flag))


def most(value: int) -> int:
    """The largest of every rank's `value`: a blocking vote on the host's gloo group.

    No GPU sync; a stream's batches use it to end an epoch, or to stop after a failed read,
    on the same batch on every rank.
    """
    if _vote_group is None:
        return value
    tensor = torch.tensor([value])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_vote_group)
    return int(tensor.item())


def gather_objects(obj: Any, io: bool = False) -> list[Any]:
    """List of `obj` from every rank, in rank order (on every rank); `io` as in `barrier`."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_io_group if io else None)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's `tensor`, concatenated along dim 0 in rank order, gradients included.

    For a loss over the global batch rather than each process's share: in-batch negatives of
    a contrastive loss, a batch-wide normalisation. Each process computes its loss from its
    own rows against all of them; the backward pass sends every process the gradient of its
    own rows from all processes' losses, and DDP's average then equals the gradient of the
    mean loss over the global batch. All processes must call it with the same shape but for
    dim 0. One process: `tensor` itself.
    """
    if not _active() or dist.get_world_size() == 1:
        return tensor
    from torch.distributed.nn.functional import all_gather  # noqa: PLC0415  (used rarely)

    return torch.cat(all_gather(tensor), dim=0)


def warn_unlaunched(env: Mapping[str, str], denv: DistEnv) -> str | None:
    """A hint when the job asked for several tasks but this process was not started by srun."""
    ntasks = int(env.get("SLURM_NTASKS", "1") or 1)
    if denv.launcher == "single" and ntasks > 1:
        return (
            f"SLURM_NTASKS={ntasks} but this process was not started by srun or torchrun; "
            "training on one process (prefix the command with srun to use all tasks)"
        )
    return None
