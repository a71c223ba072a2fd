"""GPU checks: run on a GPU node (`pytest -m gpu`); skipped where CUDA is missing.

One short run covers what the CPU tests cannot: precisions, memory layout, compile, pinned
memory, the time report, random state on a GPU, and NCCL with two GPUs.
"""

import json
from pathlib import Path

import pytest
import torch

from conftest import blobs, pkg, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
GPU = ["run.figures=false", "data.verify_raw=false", "train.device=cuda", "run.progress=log"]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def train(*overrides: str, **options: object):
    task = blobs(*GPU, *overrides, **options)
    return pkg("trainer").train(task.cfg, task)


def weights(project: Path, name: str) -> dict[str, torch.Tensor]:
    return pkg("checkpoint").load_latest(project / "runs" / name / "checkpoints")["model"]


def test_auto_precision_is_bf16_exactly_on_native_hardware(project: Path) -> None:
    result = train("run.name=auto", "train.precision=auto", "model.compile=true", "train.epochs=5")
    assert result.summary["val_accuracy"] > 0.9
    assert result.summary["peak_gpu_mem_gib"] > 0
    native = torch.cuda.get_device_capability() >= (8, 0)
    expected = torch.bfloat16 if native else None
    assert pkg("runtime").autocast_dtype("auto", torch.device("cuda")) == expected


def test_fp16_with_loss_scaling(project: Path) -> None:
    result = train("run.name=fp16", "train.precision=fp16", "train.epochs=5")
    assert result.summary["val_accuracy"] > 0.9
    state = pkg("checkpoint").load_latest(project / "runs" / "fp16" / "checkpoints")
    assert state["scaler"]["scale"] > 0


@pytest.mark.usefixtures("digits_project")
def test_deterministic_channels_last_cnn() -> None:
    cfg = pkg("config").load_config(
        None,
        [
            *GPU,
            *("task.name=digits", "run.name=cnn", "model.name=cnn", "model.channels_last=true"),
            *("run.deterministic=true", "train.epochs=2", "train.precision=bf16"),
        ],
    )
    assert pkg("trainer").train(cfg).summary["status"] == "finished"


def test_resume_restores_this_gpus_random_state(project: Path) -> None:
    common = ["train.epochs=2", "run.deterministic=true", "train.precision=fp32"]
    train(*common, "run.name=a")
    train(*common, "run.name=b", "run.max_steps_this_segment=5")
    state = pkg("checkpoint").load_latest(project / "runs" / "b" / "checkpoints")
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
