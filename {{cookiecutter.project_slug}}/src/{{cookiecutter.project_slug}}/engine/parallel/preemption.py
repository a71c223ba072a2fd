"""Stop signals: the handlers only set a flag; the trainer acts on it at a step boundary.

Slurm sends a signal shortly before the time limit (`#SBATCH --signal=...`) and SIGTERM when it
preempts or cancels a job. Saving inside a signal handler can catch the model mid-update and
deadlocks collective calls, so the handler records the request and the training loop, once all
ranks agree (`distributed.StepVote`: the step after any rank saw it), writes a checkpoint and
exits with EXIT_REQUEUE. The job script sees that code and
requeues the job; the next start resumes from the checkpoint.

Ctrl-C (SIGINT) is a stop signal too: the first one checkpoints at the next step boundary, as
USR1 does, instead of losing the work since the last checkpoint; a second one stops at once
(KeyboardInterrupt), without a new checkpoint.
"""

import ctypes
import os
import signal
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_REQUEUE = 3
"""Exit code of `train` meaning: checkpoint written after a stop signal, please requeue."""

EXIT_DIVERGED = 4
"""Exit code of `train` meaning: the loss or weights became NaN/inf; last finite checkpoint kept."""

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1  # Linux prctl(2): the signal this process gets when its parent ends


class StopRequest:
    """Remembers whether (and which) stop signal arrived."""

    def __init__(self) -> None:
        """Start with no request."""
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signal_name is not None

    def handle(self, signum: int, _frame: types.FrameType | None) -> None:
        """Signal handler: set the flag; a repeated Ctrl-C interrupts at once."""
        if signum == signal.SIGINT:
            if self.signal_name == "SIGINT":
                raise KeyboardInterrupt
            # os.write: print() inside a handler can hit stdout mid-write (reentrant call).
            os.write(2, b"\nCtrl-C: checkpoint at the next step, then exit; Ctrl-C again: now\n")
        self.signal_name = signal.Signals(signum).name


def stop_message(signal_name: str | None, step: int, run: str) -> str:
    """What follows a stop: the job script requeues after USR1 and after a preemption."""
    name = signal_name or "on another rank"
    done = f"stop signal ({name}): checkpoint at step {step} written, exit {EXIT_REQUEUE}"
    if signal_name == "SIGTERM":  # a preemption, or scancel / the hard time limit
        return (
            f"{done}; the job script requeues a preempted job, not a cancelled one: "
            f"start run.name={run} again to resume that"
        )
    if signal_name == "SIGINT":
        return f"{done}; start run.name={run} again to resume"
    return f"{done} (the job script requeues; the next start resumes)"


@contextmanager
def catch_stop_signals() -> Iterator[StopRequest]:
    """Install the flag-setting handlers for the duration of a training run, then restore.

    Once a stop signal arrived they are not restored: Slurm repeats its signals, and a second
    one arriving between the checkpoint and the exit would otherwise kill the process with
    the default action, hiding the exit code the job script requeues on. Ctrl-C is the
    exception: Slurm does not repeat it, and one pressed again should still interrupt.
    """
    request = StopRequest()
    previous = {sig: signal.signal(sig, request.handle) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            keep = request.requested and sig != signal.SIGINT
            signal.signal(sig, signal.SIG_IGN if keep else handler)


def start_worker(_worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: stop signals left to the main process, gone with it."""
    ignore_stop_signals()
    end_with_parent()


def end_with_parent() -> None:
    """Linux: this process is killed when its parent ends.

    A worker's parent is the training process, or the fork server that ends with it. When the
    training process is killed outright, a worker would otherwise stay behind (seen after a
    killed job): torch's worker then waits at its exit for a queue that nobody reads.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def ignore_stop_signals() -> None:
    """Leave stop signals (Ctrl-C too) to the main process: a worker does not stop on them.

    Slurm signals every process of a job step; a worker killed by SIGTERM would make the main
    process fail on its next batch before it could write the checkpoint.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
