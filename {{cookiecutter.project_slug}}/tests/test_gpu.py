"""GPU checks: run on a GPU node (`make gpu-check`, or `pytest -m gpu`); skipped without CUDA.

Short runs cover what the CPU tests cannot: precisions, memory layout, compile, pinned
memory, the time report, random state on a GPU, NCCL with two GPUs under torchrun and under
the srun launcher's variables, a stop signal mid-run and during validation with an exact
resume, background checkpoints staged in pinned memory, the memory of a resumed segment, the
in-memory path's free-memory rule, and the diagnostics (profiler trace with GPU kernels, the
snapshot after an out-of-memory error).
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import PACKAGE, blobs, cli_env, pkg, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
GPU = ["run.figures=false", "data.verify_raw=false", "train.device=cuda", "run.progress=log"]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def train(*overrides: str, **options: object):
    task = blobs(*GPU, *overrides, **options)
    return pkg("engine.loop.trainer").train(task.cfg, task)


def weights(project: Path, name: str) -> dict[str, torch.Tensor]:
    return pkg("engine.state.checkpoint").load_latest(project / "runs" / name / "checkpoints")[
        "model"
    ]


def test_auto_precision_is_bf16_exactly_on_native_hardware(project: Path) -> None:
    result = train("run.name=auto", "train.precision=auto", "model.compile=true", "train.epochs=5")
    assert result.summary["val_accuracy"] > 0.9
    assert result.summary["peak_gpu_mem_gib"] > 0
    native = torch.cuda.get_device_capability() >= (8, 0)
    expected = torch.bfloat16 if native else None
    assert pkg("engine.parallel.runtime").autocast_dtype("auto", torch.device("cuda")) == expected


def test_fp16_with_loss_scaling(project: Path) -> None:
    result = train("run.name=fp16", "train.precision=fp16", "train.epochs=5")
    assert result.summary["val_accuracy"] > 0.9
    state = pkg("engine.state.checkpoint").load_latest(project / "runs" / "fp16" / "checkpoints")
    assert state["scaler"]["scale"] > 0


@pytest.mark.usefixtures("digits_project")
def test_deterministic_channels_last_cnn() -> None:
    cfg = pkg("task").load_config(
        None,
        [
            *GPU,
            *("task.name=digits", "run.name=cnn", "model.name=cnn", "model.channels_last=true"),
            *("run.deterministic=true", "train.epochs=2", "train.precision=bf16"),
        ],
    )
    assert pkg("engine.loop.trainer").train(cfg).summary["status"] == "finished"


def test_resume_restores_this_gpus_random_state(project: Path) -> None:
    common = ["train.epochs=2", "run.deterministic=true", "train.precision=fp32"]
    train(*common, "run.name=a")
    train(*common, "run.name=b", "run.max_steps_this_segment=5")
    state = pkg("engine.state.checkpoint").load_latest(project / "runs" / "b" / "checkpoints")
    # One generator state per process, not one per visible GPU: a start that sees fewer
    # GPUs (one per task) restores it.
    assert all(r["cuda"].dim() == 1 for r in state["rng"])
    train(*common, "run.name=b")
    a, b = weights(project, "a"), weights(project, "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_pinned_dataloader_matches_in_memory_batches(project: Path) -> None:
    common = ["train.epochs=2", "run.deterministic=true", "train.precision=fp32"]
    train(*common, "run.name=mem", "data.in_memory=yes")
    train(*common, "run.name=loader", "data.in_memory=no", "data.num_workers=2")
    a, b = weights(project, "mem"), weights(project, "loader")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_time_report_counts_gpu_work_and_does_not_overstate_throughput(project: Path) -> None:
    # A wide model: the GPU, not the host, sets the pace.
    result = train(
        "run.name=timed",
        "model.hidden=4096",
        "model.depth=4",
        "train.batch_size=256",
        "train.epochs=3",
        "run.log_every_steps=5",
        n=20000,
    )
    s = result.summary
    # The checkpoint and validation synchronise, so this is a synchronised measurement.
    measured = s["samples"] / (s["wall_s"] - s["eval_s"] - s["checkpoint_s"])
    assert s["samples_per_s"] <= 1.15 * measured, s
    assert s["other_share"] < 0.15, s


@two_gpus
def test_nccl_two_gpus_compiled_with_accumulation(project: Path) -> None:
    args = [*GPU, "task.name=toy_tasks.blobs", "run.name=nccl", "train.epochs=3"]
    args += ["model.compile=true", "train.grad_accum_steps=2", "train.batch_size=32"]
    out = run_cli("train", *args, project=project, torchrun=2, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 process(es) via torchrun" in out.stdout
    summary = json.loads((project / "runs" / "nccl" / "summary.json").read_text())
    assert summary["val_accuracy"] > 0.9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@two_gpus
def test_srun_launcher_path_with_nccl(project: Path) -> None:
    # Two processes with the variables `srun --ntasks=2` gives its tasks (the default launcher
    # of slurm/train.sbatch): ranks, local ranks and the rendezvous come from them.
    port, args = _free_port(), [*GPU, "task.name=toy_tasks.blobs", "run.name=srun"]
    procs = []
    for rank in range(2):
        env = {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "localhost",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", PACKAGE, "train", *args, "train.epochs=3"],
                cwd=project,
                env=cli_env(project, env),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert "2 process(es) via slurm" in outs[0]
    summary = json.loads((project / "runs" / "srun" / "summary.json").read_text())
    assert summary["val_accuracy"] > 0.9


def _signal_on_call(monkeypatch: pytest.MonkeyPatch, method: str, call: int) -> None:
    """Send this process SIGUSR1 as Trainer.<method> is called for the `call`-th time (once)."""
    trainer_class = pkg("engine.loop.trainer").Trainer
    original, calls = getattr(trainer_class, method), [0]

    def signalled(self: object, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), signal.SIGUSR1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(trainer_class, method, signalled)


@pytest.mark.parametrize(("method", "call"), [("optimizer_step", 7), ("validate", 1)])
def test_stop_signal_on_a_gpu_checkpoints_and_resumes_identically(
    project: Path, monkeypatch: pytest.MonkeyPatch, method: str, call: int
) -> None:
    # USR1 mid-epoch, and USR1 while a validation runs (every 4 steps): exit 3 after the
    # checkpoint, then the resumed run ends with the weights of an uninterrupted one.
    common = ["train.epochs=3", "run.deterministic=true", "train.precision=fp32"]
    common += ["run.log_every_steps=2", "run.val_every_steps=4"]
    whole = train(*common, "run.name=whole")
    _signal_on_call(monkeypatch, method, call)
    stopped = train(*common, "run.name=parts")
    assert (stopped.exit_code, stopped.summary["status"]) == (3, "stopped")
    assert 0 < stopped.summary["step"] < whole.summary["step"]
    # The signal came once; the resumed run counts on from there and is not signalled again.
    assert train(*common, "run.name=parts").summary["status"] == "finished"
    a, b = weights(project, "whole"), weights(project, "parts")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_background_checkpoints_from_pinned_buffers_equal_blocking_ones(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Background saves copy the state into pinned buffers that the next save reuses: the
    # checkpoints of steps 3 and 6 (background) and 9 (final) equal a blocking run's. A GPU
    # reaches step 6 before step 3's save is on the disk, which would skip it: here the save
    # due then waits for the previous one instead, so that both background saves are made.
    monkeypatch.setattr(pkg("engine.state.checkpoint_io").Checkpointer, "skip", lambda *_: False)
    common = ["train.epochs=3", "run.deterministic=true", "train.precision=fp32"]
    common += ["run.checkpoint_every_steps=3", "run.keep_checkpoints=10"]
    train(*common, "run.name=background", "run.async_checkpoint=true")
    train(*common, "run.name=blocking")
    ckpt = pkg("engine.state.checkpoint")
    found = {
        name: dict(ckpt.list_checkpoints(project / "runs" / name / "checkpoints"))
        for name in ("background", "blocking")
    }
    assert sorted(found["background"]) == sorted(found["blocking"]) == [3, 6, 9]
    for step, path in found["background"].items():
        a, b = ckpt.load(path), ckpt.load(found["blocking"][step])
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
        moments = [(a["optimizer"]["state"][i], s) for i, s in b["optimizer"]["state"].items()]
        assert all(torch.equal(x[k], y[k]) for x, y in moments for k in y), step


def test_resumed_segment_needs_no_more_gpu_memory(project: Path) -> None:
    # Each segment in its own process, so each peak is its own. Loading the checkpoint must
    # not hold a second copy of the weights and optimizer state on the GPU while training.
    args = [*GPU, "task.name=toy_tasks.blobs", "model.hidden=4096", "model.depth=4"]
    args += ["train.epochs=2", "train.precision=fp32"]

    def peak(name: str, *extra: str) -> float:
        out = run_cli("train", *args, f"run.name={name}", *extra, project=project)
        assert out.returncode == 0, out.stdout + out.stderr
        summary = json.loads((project / "runs" / name / "summary.json").read_text())
        return float(summary["peak_gpu_mem_gib"])

    whole = peak("whole")
    first = peak("parts", "run.max_steps_this_segment=5")
    resumed = peak("parts")
    print(f"\npeak GPU memory GiB: whole {whole}, first segment {first}, resumed {resumed}")
    assert resumed <= 1.05 * whole + 0.02


def test_in_memory_auto_leaves_half_the_free_gpu_memory() -> None:
    fits, device = pkg("engine.parallel.runtime").fits_in_memory, torch.device("cuda")
    free, _ = torch.cuda.mem_get_info(device)
    assert fits(1 << 20, 1e6, device)
    assert not fits(int(0.75 * free), 1e6, device)
    hog = torch.empty(int(0.6 * free), dtype=torch.uint8, device=device)  # a neighbour's share
    assert not fits(int(0.3 * free), 1e6, device)
    del hog


def test_profiler_trace_shows_gpu_kernels(project: Path) -> None:
    args = [*GPU, "task.name=toy_tasks.blobs", "run.name=prof", "run.profile_steps=3"]
    out = run_cli("train", *args, project=project)
    assert out.returncode == 0, out.stdout + out.stderr
    trace = json.loads((project / "runs" / "prof" / "profile-rank0.json").read_text())
    assert any(event.get("cat") == "kernel" for event in trace["traceEvents"])


def test_out_of_memory_leaves_a_snapshot(tmp_path: Path) -> None:
    snapshot = pkg("observe.diagnostics").snapshot_on_oom(tmp_path, debug=True)
    with pytest.raises(torch.OutOfMemoryError), snapshot:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a petabyte
    assert (tmp_path / "memory-snapshot-rank0.pickle").stat().st_size > 0
