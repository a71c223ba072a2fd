"""Failures say so: a crash in task code or a worker, a diverged loss, a busy run, stop signals."""

import csv
import errno
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import PACKAGE, CliHere, blobs, cli_env, pkg, run_cli

trainer = pkg("engine.loop.trainer")
checkpoint = pkg("engine.state.checkpoint")
preemption = pkg("engine.parallel.preemption")
ConfigError = pkg("errors").ConfigError

FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "train.batch_size=32"]
# A faulty task on the DataLoader path (dict samples), small enough to fail within seconds.
CRASH = [*FAST, "task.name=toy_tasks.broken", "task.samples=dicts", "task.n=200", "run.name=c"]
CAUSES = {
    "getitem": "ValueError: sample",
    "collate": "RuntimeError: stack expects each tensor to be equal size",
    "raise_loss": "FaultError: loss() failed",
    "raise_evaluate": "FaultError: evaluate() failed",
}


def last_line(out: subprocess.CompletedProcess[str]) -> str:
    """The final stderr line of a run that must have failed with exit 1."""
    assert out.returncode == 1, out.stderr[-3000:]
    return out.stderr.rstrip().splitlines()[-1]


def read_error(out: subprocess.CompletedProcess[str]) -> str:
    """The one line of a run whose data failed to read (exit 6), with no traceback anywhere."""
    assert out.returncode == pkg("engine.loop.read_stop").EXIT_DATA, out.stdout[-3000:] + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fault", list(CAUSES))
def test_an_error_in_a_worker_or_in_task_code_ends_the_process_with_its_cause(
    project: Path,
    cli_here: CliHere,
    fault: str,
    workers: int,
) -> None:
    """Reading a batch (`__getitem__`, `collate`): one line; the task's loss: its traceback."""
    # Workers ignore SIGTERM: unless they are shut down explicitly, the process hung in
    # multiprocessing's exit handler, so with workers the run is a process of its own (the
    # timeout only keeps a regression from hanging CI). Without, the same lines come from
    # `cli.main` in this process.
    args = ("train", *CRASH, f"task.fault={fault}", f"data.num_workers={workers}")
    out = run_cli(*args, project=project, timeout=180) if workers else cli_here(*args)
    if fault in ("getitem", "collate"):
        line = read_error(out)
        where = "in DataLoader worker" if workers else "in process 0;"
        assert CAUSES[fault] in line and where in line, line
        assert "no step done in this segment, nothing saved, exit 6" in line  # batch 0 failed
        assert "Traceback" in (project / "runs" / "c" / "errors.log").read_text("utf-8")
    else:
        line = last_line(out)
        assert line.startswith("error: ") and CAUSES[fault] in line, line
        assert "Traceback" in out.stderr


@pytest.mark.parametrize("fault", ["getitem", "raise_loss", "raise_evaluate"])
def test_workers_end_with_the_error_even_while_its_traceback_is_kept(
    project: Path, fault: str
) -> None:
    # A caller that keeps the exception (a notebook, pytest here) keeps the loader's iterator
    # alive through the traceback: the trainer must have ended the workers itself.
    before = set(multiprocessing.active_children())
    args = [*CRASH, f"task.fault={fault}", "data.num_workers=2"]
    cfg = pkg("task").load_config(None, args)
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    if fault == "getitem":  # a read that failed: no exception, the run's own exit code
        assert trainer.train(cfg, task).summary["status"] == "data-failed"
    else:
        with pytest.raises(Exception, match=r"failed") as caught:
            trainer.train(cfg, task)
        assert caught.tb is not None
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.slow
def test_an_error_on_one_rank_ends_every_rank(project: Path) -> None:
    out = run_cli(
        "train",
        *CRASH,
        "task.fault=getitem",
        "task.fault_rank=1",
        "data.num_workers=2",
        project=project,
        torchrun=2,
        timeout=240,
    )
    assert out.returncode != 0
    line = "error: reading the training data failed: ValueError: sample"
    assert line in out.stdout and "of process 1;" in out.stdout, out.stdout[-3000:]


def test_a_diverged_loss_stops_with_its_own_code_and_keeps_finite_checkpoints(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = blobs(*FAST, "run.name=nan", "run.log_every_steps=5", "run.checkpoint_every_steps=5")
    loss, calls = task.loss, []

    def poisoned(model: torch.nn.Module, batch: object) -> torch.Tensor:
        calls.append(1)
        value = loss(model, batch)
        return value * math.nan if len(calls) > 12 else value  # NaN from step 13 on

    task.loss = poisoned
    result = trainer.train(task.cfg, task)
    assert result.exit_code == preemption.EXIT_DIVERGED == 4
    assert result.summary["status"] == "diverged"
    out = capsys.readouterr().out
    assert "the last finite checkpoint is step 10" in out
    saved = checkpoint.list_checkpoints(project / "runs" / "nan" / "checkpoints")
    assert [step for step, _ in saved] == [5, 10]
    for _, path in saved:
        assert all(torch.isfinite(w).all() for w in checkpoint.load(path)["model"].values())


def test_nonfinite_patience_tolerates_single_windows(project: Path) -> None:
    task = blobs(*FAST, "run.name=spike", "run.log_every_steps=1", "train.nonfinite_patience=1")
    loss, calls = task.loss, []

    def spike(model: torch.nn.Module, batch: object) -> torch.Tensor:
        calls.append(1)
        # One NaN loss that does not reach the weights (its gradient is zero).
        return loss(model, batch) + (math.nan if len(calls) == 3 else 0.0)

    task.loss = spike
    result = trainer.train(task.cfg, task)
    assert result.summary["status"] == "finished"


def test_a_second_stop_signal_after_the_checkpoint_does_not_kill_the_process() -> None:
    code = (
        f"import os, signal\nfrom {PACKAGE}.engine.parallel.preemption import catch_stop_signals\n"
        "with catch_stop_signals():\n    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "for sig in (signal.SIGUSR1, signal.SIGTERM):\n    os.kill(os.getpid(), sig)\n"
        "print('alive')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(Path.cwd()),
        capture_output=True,
        text=True,
        check=False,
    )
    assert (out.returncode, out.stdout) == (0, "alive\n"), out.stderr


def test_without_a_stop_signal_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with preemption.catch_stop_signals():
        pass
    assert signal.getsignal(signal.SIGUSR1) is before


def ended(pid: int) -> bool:
    """Whether process `pid` is gone (or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_worker_ends_when_its_parent_is_killed_outright(project: Path) -> None:
    """kill -9 of the training process (or of the fork server): no worker stays behind."""
    code = (
        f"import os, time\nfrom {PACKAGE}.engine.parallel.preemption import end_with_parent\n"
        "if os.fork() == 0:\n    end_with_parent()\n    print(os.getpid(), flush=True)\n"
        "    time.sleep(600)\n    os._exit(0)\ntime.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], env=cli_env(project), stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())  # it has asked to end with its parent
        parent.kill()
    deadline = time.monotonic() + 60  # an upper bound on a loaded machine; it ends at once
    while not ended(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ended(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived its parent")


def test_a_second_job_on_the_same_run_name_stops_with_one_line(project: Path) -> None:
    run_dir = project / "runs" / "busy"
    code = (
        f"import sys, time\nfrom pathlib import Path\n"
        f"from {PACKAGE}.engine.state.checkpoint import lock_run_dir\n"
        f"with lock_run_dir(Path({str(run_dir)!r})):\n"
        "    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        env=cli_env(project),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        task = blobs(*FAST, "run.name=busy", "train.epochs=1")
        with pytest.raises(ConfigError, match=rf"in use by pid {holder.pid} on "):
            trainer.train(task.cfg, task)
        assert not (run_dir / "checkpoints").exists()
    finally:
        holder.communicate("")
    assert trainer.train(task.cfg, task).exit_code == 0  # the lock goes with its holder


def test_a_job_refused_just_after_the_lock_was_taken_still_names_its_holder(
    project: Path,
) -> None:
    """Two array tasks start together: the second may look before the first wrote its name."""
    path = project / "runs" / "race" / ".lock"
    path.parent.mkdir(parents=True)
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\n"
        "sys.stdin.readline()\nos.pwrite(fd, b'job 7, pid 1 on node1\\n', 0)\n"
        "print('named', flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None and holder.stdout is not None
    refused: list[str] = []

    def second_job() -> None:
        try:
            with checkpoint.lock_run_dir(path.parent):
                refused.append("not refused")
        except ConfigError as err:
            refused.append(str(err))

    try:
        assert holder.stdout.readline() == "locked\n"  # held, with no name in the file yet
        looking = threading.Thread(target=second_job)
        looking.start()
        holder.stdin.write("name yourself\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "named\n"
        looking.join()
    finally:
        holder.communicate("")
    assert len(refused) == 1 and "is in use by job 7, pid 1 on node1;" in refused[0], refused


def test_a_lock_whose_holder_was_killed_is_taken_over_with_a_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = project / "runs" / "orphan"
    code = (
        f"import sys\nfrom pathlib import Path\nfrom {PACKAGE}.engine.state.checkpoint import "
        f"lock_run_dir\nwith lock_run_dir(Path({str(run_dir)!r})):\n"
        "    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    env = cli_env(project, {"SLURM_JOB_ID": "4242"})
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    holder.kill()  # kill -9: the system drops the lock, the file still names the holder
    holder.communicate()
    task = blobs(*FAST, "run.name=orphan", "train.epochs=1")
    assert trainer.train(task.cfg, task).exit_code == 0
    said = capsys.readouterr().out
    assert f"was held by job 4242, pid {holder.pid} on " in said
    assert "ended without releasing it; taking it over" in said
    # A run that ended in order leaves nothing to take over.
    task = blobs(*FAST, "run.name=orphan", "train.epochs=2")
    assert trainer.train(task.cfg, task).exit_code == 0
    assert "taking it over" not in capsys.readouterr().out
    assert (run_dir / ".lock").read_text(encoding="utf-8") == ""


def test_metrics_history_survives_a_failure_while_resuming(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = project / "runs" / "hist"
    run_dir.mkdir(parents=True)
    fields = ("step", "epoch", "phase", "loss")
    log = pkg("observe.metrics").MetricsLog(run_dir, "csv", 0, fields)
    for step in (1, 2, 3):
        log.write(step=step, epoch=0, phase="train", loss=1.0)
    log.close()

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt  # stands for a kill while the history is rewritten

    monkeypatch.setattr(csv.DictWriter, "writerows", killed)
    with pytest.raises(KeyboardInterrupt):
        pkg("observe.metrics").MetricsLog(run_dir, "csv", 2, fields)
    with (run_dir / "metrics.csv").open() as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["1", "2", "3"]


def test_a_bare_start_in_a_multi_task_job_says_so(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_NTASKS", "2")
    task = blobs(*FAST, "run.name=bare", "train.epochs=1")
    trainer.train(task.cfg, task)
    assert "warning: SLURM_NTASKS=2 but this process was not started by srun" in (
        capsys.readouterr().out
    )


def test_fsync_refused_on_a_directory_is_tolerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if Path(f"/proc/self/fd/{fd}").is_dir():
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint.save_atomic({"a": torch.ones(2)}, tmp_path / "x.pt")
    assert torch.equal(checkpoint.load(tmp_path / "x.pt")["a"], torch.ones(2))


def test_auto_precision_needs_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, cuda = pkg("engine.parallel.runtime"), torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_a, **_k: True)  # emulated
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_a: (7, 0))  # V100
    assert runtime.autocast_dtype("auto", cuda) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_a: (8, 0))  # A100
    assert runtime.autocast_dtype("auto", cuda) is torch.bfloat16


def test_in_memory_auto_leaves_gpu_memory_free(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, cuda = pkg("engine.parallel.runtime"), torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_a: (3 * 10**9, 80 * 10**9))
    assert runtime.fits_in_memory(10**9, 4.0, cuda)
    assert not runtime.fits_in_memory(2 * 10**9, 4.0, cuda)  # more than half the free memory
    assert runtime.fits_in_memory(2 * 10**9, 4.0, torch.device("cpu"))
