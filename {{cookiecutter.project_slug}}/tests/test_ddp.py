"""Two CPU processes with gloo, started the way `srun` starts them (SLURM_* variables)."""

import csv
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import PACKAGE, cli_env, pkg

checkpoint = pkg("engine.state.checkpoint")
distributed = pkg("engine.parallel.distributed")

# Every test here starts two or more processes: `make test-all` and CI run them.
pytestmark = pytest.mark.slow
ARGS = [
    "train",
    "task.name=toy_tasks.blobs",
    "data.verify_raw=false",
    "run.figures=false",
    "run.progress=log",
    "run.log_every_steps=2",
    "model.hidden=32",
    "model.dropout=0.0",
    "train.epochs=6",
    "run.name=ddp",
]


def free_job_id() -> int:
    """A job id whose derived rendezvous port is free right now."""
    for _ in range(100):
        # The system's generator: the trainer reseeds `random` in this process, which would
        # make every run of the suite pick the same ids (and ports) as the last one.
        job_id = random.SystemRandom().randint(4_000_000, 5_000_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", distributed.rendezvous_port(job_id, 0)))
            except OSError:
                continue
        return job_id
    raise RuntimeError("no free port")


def srun_like(project: Path, job_id: int, *extra: str) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in range(2):
        env = cli_env(
            project,
            {
                "SLURM_JOB_ID": str(job_id),
                "SLURM_JOB_NODELIST": "localhost",
                "SLURM_NTASKS": "2",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank),
            },
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", PACKAGE, *ARGS, "train.batch_size=16", *extra],
                cwd=project,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def test_two_ranks_agree_on_a_stop_and_match_one_process_with_the_global_batch(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rank0, rank1 = srun_like(project, free_job_id())
    lines = []
    assert rank0.stdout is not None
    for line in rank0.stdout:
        lines.append(line)
        if "step 8/" in line:
            rank1.send_signal(signal.SIGUSR1)  # only one rank gets the signal
            break
    out0 = "".join(lines) + rank0.communicate(timeout=120)[0]  # the rest; closes the pipe
    out1 = rank1.communicate(timeout=120)[0]
    assert (rank0.returncode, rank1.returncode) == (3, 3), out0 + out1
    assert "2 process(es) via slurm" in out0
    assert "stop signal (on another rank)" in out0
    assert out1.strip() == ""  # rank 1 stays silent: one log, one set of files
    stopped_at = checkpoint.load_latest(project / "runs" / "ddp" / "checkpoints")["position"]

    # Resume in one process with the same global batch (1 x 32): each step then sees the same
    # samples as the two ranks together, so it continues the same trajectory; compare with a
    # single-process run from the start.
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    assert train(load(None, [*ARGS[1:], "train.batch_size=32"])).exit_code == 0
    assert f"resumed from step {stopped_at['step']}" in capsys.readouterr().out
    train(load(None, [*ARGS[1:], "train.batch_size=32", "run.name=single"]))
    resumed = checkpoint.load_latest(project / "runs" / "ddp" / "checkpoints")
    single = checkpoint.load_latest(project / "runs" / "single" / "checkpoints")
    assert resumed["position"] == single["position"]
    for key, value in single["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=1e-4, atol=1e-5)
    # The logged train loss is the mean over both ranks: the single process's loss.
    two, one = train_losses(project / "runs" / "ddp"), train_losses(project / "runs" / "single")
    assert two, "no train rows"
    for step in (s for s in two if s <= stopped_at["step"]):
        assert two[step] == pytest.approx(one[step], rel=1e-4), step


@pytest.mark.parametrize("where", ["task.usr1_step=5", "task.usr1_in_val=true"])
def test_a_stop_on_one_rank_stops_every_rank_at_the_next_step_and_resumes_exactly(
    project: Path, where: str
) -> None:
    # Rank 1 alone signals itself during step 5, or during the first validation (after step
    # 13, the epoch's last). No logging step comes before the epoch ends: the ranks agree by
    # the per-step vote, whose answer arrives one step later on every rank.
    quiet = ["train.epochs=2", "run.log_every_steps=1000"]
    for name, extra in (("voted", [where]), ("voted", []), ("straight", [])):
        procs = srun_like(project, free_job_id(), *quiet, f"run.name={name}", *extra)
        outs = [p.communicate(timeout=120)[0] for p in procs]
        codes = [p.returncode for p in procs]
        if extra:  # the stopped segment
            assert codes == [3, 3], "".join(outs)
            stopped = 6 if "step" in where else 14
            assert f"stop signal (on another rank): checkpoint at step {stopped} " in outs[0]
        else:
            assert codes == [0, 0], "".join(outs)
    runs = project / "runs"
    resumed = checkpoint.load_latest(runs / "voted" / "checkpoints")
    straight = checkpoint.load_latest(runs / "straight" / "checkpoints")
    assert resumed["position"] == straight["position"]
    for key, value in straight["model"].items():
        assert torch.equal(resumed["model"][key], value), key


def val_column(run_dir: Path, column: str) -> dict[int, float]:
    """{step: value} of a column of the validation rows."""
    with (run_dir / "metrics.csv").open() as f:
        return {int(r["step"]): float(r[column]) for r in csv.DictReader(f) if r["phase"] == "val"}


def train_losses(run_dir: Path, column: str = "loss") -> dict[int, float]:
    """{step: value} of a column of the train rows."""
    with (run_dir / "metrics.csv").open() as f:
        found = csv.DictReader(f)
        return {int(r["step"]): float(r[column]) for r in found if r["phase"] == "train"}


def test_two_ranks_finish_with_figures(project: Path) -> None:
    # Rank 0 draws the figures alone after training: no collective may wait for rank 1 there.
    procs = srun_like(project, free_job_id(), "train.epochs=1", "run.figures=true")
    out = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "".join(out)
    assert (project / "reports" / "figures" / "ddp" / "confusion_matrix.png").is_file()


CONTRASTIVE = ["task.name=toy_tasks.contrastive", "run.log_every_steps=1"]  # 6 x 16 steps


def ended(procs: list[subprocess.Popen[str]], codes: tuple[int, int] = (0, 0)) -> str:
    """Rank 0's output once both ranks ended with `codes`."""
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert tuple(p.returncode for p in procs) == codes, "".join(outs)
    return outs[0]


def test_gathered_negatives_over_two_ranks_match_one_process_and_resume_exactly(
    project: Path,
) -> None:
    # 2 x 16 rows with every rank's rows as negatives: the loss and trajectory of 1 x 32.
    ended(srun_like(project, free_job_id(), *CONTRASTIVE))
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    single = [*ARGS[1:-1], *CONTRASTIVE, "train.batch_size=32", "run.name=single"]
    assert train(load(None, single)).exit_code == 0
    runs = project / "runs"
    gathered, one = train_losses(runs / "ddp"), train_losses(runs / "single")
    assert len(gathered) == 96
    assert gathered == pytest.approx(one, rel=1e-5)
    # The task's recorded scalar: averaged over the ranks, the one process's value.
    top1 = train_losses(runs / "ddp", "top1")
    assert top1 == pytest.approx(train_losses(runs / "single", "top1"), rel=1e-5)
    assert 0 < min(top1.values()) < max(top1.values()) <= 1
    # Recall@1 over the whole validation split, from every rank's kept embeddings: the same
    # as one process's (a mean of per-rank values would differ, as the in-batch top1 does).
    recall = val_column(runs / "ddp", "recall1")
    assert recall == pytest.approx(val_column(runs / "single", "recall1"), abs=1 / 64)
    assert len(recall) == 6 and 0 < max(recall.values()) <= 1
    # Each rank's own 16 rows only: the easier task of fewer negatives, another loss.
    ended(srun_like(project, free_job_id(), *CONTRASTIVE, "task.gather=false", "run.name=own"))
    assert train_losses(runs / "own")[1] < gathered[1] - 0.1

    # Stopped by a signal to one rank and resumed: the weights of the run without a stop.
    procs = srun_like(project, free_job_id(), *CONTRASTIVE, "run.name=stopped")
    stdout = procs[0].stdout
    assert stdout is not None
    for line in stdout:
        if "step 5/" in line:
            procs[1].send_signal(signal.SIGUSR1)
            break
    ended(procs, (3, 3))
    out = ended(srun_like(project, free_job_id(), *CONTRASTIVE, "run.name=stopped"))
    assert "resumed from step" in out
    resumed = checkpoint.load_latest(runs / "stopped" / "checkpoints")["model"]
    whole = checkpoint.load_latest(runs / "ddp" / "checkpoints")["model"]
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)
    assert train_losses(runs / "stopped", "top1") == top1
