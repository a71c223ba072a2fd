"""GPU checks: run on a GPU node (`pytest -m gpu`); skipped where CUDA is missing."""

from pathlib import Path

import pytest
import torch

from conftest import blobs, pkg

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_bf16_compiled_training_on_the_gpu(project: Path) -> None:
    cfg = pkg("config").load_config(
        None,
        [
            "run.name=gpu",
            "run.figures=false",
            "train.device=cuda",
            "train.precision=auto",
            "model.compile=true",
            "train.epochs=5",
            "data.verify_raw=false",
            "task.name=toy_tasks.blobs",
        ],
    )
    result = pkg("trainer").train(cfg, blobs())
    assert result.summary["val_accuracy"] > 0.9
    assert result.summary["peak_gpu_mem_gib"] > 0
    if torch.cuda.is_bf16_supported():
        assert pkg("runtime").autocast_dtype("auto", torch.device("cuda")) == torch.bfloat16


def test_resume_on_the_gpu_restores_cuda_rng(project: Path) -> None:
    common = [
        "run.figures=false",
        "train.device=cuda",
        "train.epochs=2",
        "data.verify_raw=false",
        "run.deterministic=true",
        "train.precision=fp32",
        "task.name=toy_tasks.blobs",
    ]
    load, train = pkg("config").load_config, pkg("trainer").train
    train(load(None, [*common, "run.name=a"]), blobs())
    train(load(None, [*common, "run.name=b", "run.max_steps_this_segment=5"]), blobs())
    train(load(None, [*common, "run.name=b"]), blobs())
    latest = pkg("checkpoint").load_latest
    a = latest(project / "runs" / "a" / "checkpoints")["model"]
    b = latest(project / "runs" / "b" / "checkpoints")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
