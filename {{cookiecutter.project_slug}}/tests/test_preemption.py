"""Stop signals in real processes: checkpoint, exit 3, resume to the same weights."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import PACKAGE, cli_env, pkg

checkpoint = pkg("engine.state.checkpoint")
EXIT_REQUEUE = pkg("engine.parallel.preemption").EXIT_REQUEUE

ARGS = [
    "train",
    "task.name=toy_tasks.blobs",
    "data.verify_raw=false",
    "run.figures=false",
    "run.progress=log",
    "run.log_every_steps=1",
    "train.batch_size=16",
    "train.epochs=15",
    "model.hidden=32",
]


def start(project: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", PACKAGE, *ARGS, *extra],
        cwd=project,
        env=cli_env(project),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, like a job step
    )


def signal_after(proc: subprocess.Popen[str], marker: str, sig: signal.Signals, group: bool) -> str:
    """Send `sig` once `marker` appears in the output; return all output."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            if group:  # Slurm signals every process of the step, DataLoader workers included
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            break
    lines.append(proc.communicate(timeout=60)[0])  # the rest; closes the pipe
    return "".join(lines)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load_latest(run_dir / "checkpoints")["model"]


def test_sigusr1_checkpoints_exits_3_and_the_rerun_matches(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = start(project, "run.name=stopped")
    output = signal_after(proc, "step 30/", signal.SIGUSR1, group=False)
    assert proc.returncode == EXIT_REQUEUE, output
    assert "stop signal (SIGUSR1)" in output
    assert "(the job script requeues" in output
    stopped = checkpoint.load_latest(project / "runs" / "stopped" / "checkpoints")
    total = 15 * (420 // 16)
    assert 30 <= stopped["position"]["step"] < total

    # The rerun and an uninterrupted reference run in this process (one thread, like the child).
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    assert train(load(None, [*ARGS[1:], "run.name=stopped"])).exit_code == 0
    assert f"resumed from step {stopped['position']['step']}" in capsys.readouterr().out
    train(load(None, [*ARGS[1:], "run.name=straight"]))
    a = weights(project / "runs" / "stopped")
    b = weights(project / "runs" / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_to_the_whole_group_spares_dataloader_workers(project: Path) -> None:
    proc = start(project, "run.name=term", "data.in_memory=no", "data.num_workers=2")
    output = signal_after(proc, "step 10/", signal.SIGTERM, group=True)
    assert proc.returncode == EXIT_REQUEUE, output
    assert "stop signal (SIGTERM)" in output
    assert "not a cancelled one: start run.name=term again" in output
    assert "Traceback" not in output
    state = checkpoint.load_latest(project / "runs" / "term" / "checkpoints")
    assert state["position"]["step"] >= 10


def test_ctrl_c_checkpoints_like_the_other_stop_signals(project: Path) -> None:
    proc = start(project, "run.name=int", "data.in_memory=no", "data.num_workers=2")
    # A terminal sends Ctrl-C to its whole foreground process group, workers included.
    output = signal_after(proc, "step 10/", signal.SIGINT, group=True)
    assert proc.returncode == EXIT_REQUEUE, output
    assert "Ctrl-C: checkpoint at the next step, then exit" in output
    assert "stop signal (SIGINT)" in output
    assert "start run.name=int again to resume" in output
    assert "Traceback" not in output
    state = checkpoint.load_latest(project / "runs" / "int" / "checkpoints")
    assert state["position"]["step"] >= 10


def test_a_second_ctrl_c_interrupts_at_once() -> None:
    with pkg("engine.parallel.preemption").catch_stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the first only asks for a checkpoint
        assert stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is not stop.handle  # Ctrl-C works as before
