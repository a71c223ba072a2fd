"""Test instrumentation for the Slurm tests, imported at start-up by the test venv (a .pth file).

Inert unless one of its variables is set in the job's environment:

PROBE_STEP_DELAY=S   Every optimizer step of a job's first attempt (SLURM_RESTART_COUNT unset
                     or 0) sleeps S seconds first. This turns the small example into a long
                     training without using CPU, so a stop signal reliably lands mid-run on any
                     machine speed; the arithmetic is untouched, and the resumed attempt runs
                     at full speed.
PROBE_HANG_DUMP=S    After S seconds, a still running process prints every thread's stack to
                     stderr (the job log), once: shows where a hung rank waits.
PROBE_DIE=R:N        Rank R (SLURM_PROCID or RANK) ends abruptly (exit code 7, no clean-up) at
                     its N-th optimizer step: a crashed rank whose peers wait in a collective.
                     A forked child keeps the rank's sockets open for 120 s, as a hung GPU or
                     network would: gloo peers would otherwise see the closed connection at
                     once, where NCCL peers wait for the distributed timeout.
PROBE_WEIGHTS_DIR=D  When the process exits, a rank of a DistributedDataParallel run saves its
                     model's weights to D/rank<R>.pt with its Slurm node name, so a test can
                     compare the weights of every rank (the trainer saves rank 0's only).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
import time
from pathlib import Path


def _install_step_delay(delay: float) -> None:
    import torch  # noqa: PLC0415 - only when the probe is active

    original = torch.optim.AdamW.step

    def slow_step(self, *args, **kwargs):
        time.sleep(delay)
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = slow_step


def _install_death(rank: int, at_step: int) -> None:
    import torch  # noqa: PLC0415 - only when the probe is active

    original = torch.optim.AdamW.step
    steps = [0]

    def dying_step(self, *args, **kwargs):
        steps[0] += 1
        if steps[0] == at_step:
            print(f"probe: rank {rank} dies at step {at_step}", file=sys.stderr, flush=True)
            if os.fork() == 0:  # the child holds the sockets, then leaves quietly
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # not the task's output: srun waits for its end
                    os.dup2(null, fd)
                time.sleep(120)
                os._exit(0)
            os._exit(7)
        return original(self, *args, **kwargs)

    torch.optim.AdamW.step = dying_step


def _install_weights_dump(out_dir: str) -> None:
    import torch  # noqa: PLC0415 - only when the probe is active
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    wrapped = []
    original_init = DistributedDataParallel.__init__

    def init(self, module, *args, **kwargs):
        original_init(self, module, *args, **kwargs)
        wrapped.append(module)

    def dump() -> None:
        if not wrapped:
            return
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "0")
        state = {k: v.detach().cpu().clone() for k, v in wrapped[-1].state_dict().items()}
        payload = {"node": os.environ.get("SLURMD_NODENAME", ""), "rank": int(rank), "model": state}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        torch.save(payload, Path(out_dir) / f"rank{rank}.pt")

    DistributedDataParallel.__init__ = init
    atexit.register(dump)


if os.environ.get("PROBE_STEP_DELAY") and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    _install_step_delay(float(os.environ["PROBE_STEP_DELAY"]))
if os.environ.get("PROBE_DIE"):
    _rank, _step = (int(v) for v in os.environ["PROBE_DIE"].split(":"))
    if int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0) == _rank:
        _install_death(_rank, _step)
if os.environ.get("PROBE_WEIGHTS_DIR"):
    _install_weights_dump(os.environ["PROBE_WEIGHTS_DIR"])
if os.environ.get("PROBE_HANG_DUMP"):
    faulthandler.dump_traceback_later(float(os.environ["PROBE_HANG_DUMP"]), exit=False)
