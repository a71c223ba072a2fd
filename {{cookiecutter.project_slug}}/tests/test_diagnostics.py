"""Diagnostics: the settings they make, the profiler trace, the OOM snapshot, transient errors."""

import json
from pathlib import Path

import pytest
import torch

from conftest import pkg

TOY = ["task.name=toy_tasks.blobs", "data.verify_raw=false", "run.figures=false", "train.epochs=1"]


def test_defaults_fill_only_what_the_environment_leaves_unset(tmp_path: Path) -> None:
    diagnostics = pkg("observe.diagnostics")
    renamed = diagnostics._torch_release() >= (2, 11)  # the flight recorder's newer names
    buffer = "TORCH_FR_BUFFER_SIZE" if renamed else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    prefix = "TORCH_FR_DUMP_TEMP_FILE" if renamed else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    env: dict[str, str] = {}
    applied = diagnostics.configure(tmp_path, debug=False, env=env)
    assert env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        buffer: "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        prefix: str(tmp_path / "nccl-trace-rank-"),
    }
    assert sorted(applied) == sorted(env)
    # A value the user set, under any of the names torch reads, stays and is not doubled.
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "PYTORCH_ALLOC_CONF": "backend:native"}
    diagnostics.configure(tmp_path, debug=True, env=mine)
    assert mine["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and "TORCH_FR_BUFFER_SIZE" not in mine
    assert "PYTORCH_CUDA_ALLOC_CONF" not in mine
    assert (mine["NCCL_DEBUG"], mine["TORCH_DISTRIBUTED_DEBUG"]) == ("INFO", "DETAIL")


def test_profile_steps_writes_a_trace_of_the_run(project: Path) -> None:
    assert pkg("cli").main(["train", *TOY, "run.name=prof", "run.profile_steps=2"]) == 0
    trace = json.loads((project / "runs" / "prof" / "profile-rank0.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("Optimizer.step" in name for name in names), sorted(names)[:20]


def test_distributed_failure_exits_with_the_code_the_job_retries(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise torch.distributed.DistNetworkError("Connection reset by peer\nmore detail")

    monkeypatch.setattr(pkg("engine.loop.trainer"), "train", broken)
    code = pkg("cli").main(["train", *TOY, "run.name=flaky"])
    assert code == pkg("observe.diagnostics").EXIT_TRANSIENT == 75
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: Connection reset by peer (transient: exit 75)"
    assert not pkg("observe.diagnostics").is_transient(ValueError("NCCL"))  # only runtime failures


def test_cuda_out_of_memory_leaves_a_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The dump itself needs CUDA (tests/test_gpu.py runs it there); here its call is recorded.
    dumped: list[str] = []
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dumped.append)
    snapshot = pkg("observe.diagnostics").snapshot_on_oom(tmp_path / "run", debug=False)
    with pytest.raises(torch.OutOfMemoryError), snapshot:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert dumped == [str(tmp_path / "run" / "memory-snapshot-rank0.pickle")]
    assert "allocator snapshot in" in capsys.readouterr().err


# Layers whose CUDA backward torch documents as nondeterministic (torch.use_deterministic_
# algorithms): with run.deterministic they warn, and the project's tests turn warnings into errors.
NONDETERMINISTIC_ON_CUDA = (
    torch.nn.AvgPool3d,
    torch.nn.AdaptiveAvgPool2d,
    torch.nn.AdaptiveAvgPool3d,
    torch.nn.AdaptiveMaxPool2d,
    torch.nn.MaxPool3d,
    torch.nn.FractionalMaxPool2d,
    torch.nn.FractionalMaxPool3d,
)


def test_shipped_models_repeat_bit_for_bit_on_cuda() -> None:
    models, config = pkg("models"), pkg("config")
    for name in models.ARCHITECTURES:
        net = models.build_model(config.ModelConfig(name=name), (1, 8, 8), 3)
        found = [type(m).__name__ for m in net.modules() if isinstance(m, NONDETERMINISTIC_ON_CUDA)]
        assert not found, f"{name}: {found}"
    # The CNN's pooling equals the layer it replaces.
    x = torch.randn(2, 4, 5, 7)
    assert torch.allclose(models.GlobalAvgPool()(x), torch.nn.AdaptiveAvgPool2d(1)(x))


@pytest.mark.parametrize("form", ["path", "open file"])
def test_full_disk_while_saving_is_one_line_naming_the_run(
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    form: str,
) -> None:
    # /dev/full fails every write with ENOSPC: torch.save to a path turns that into a
    # RuntimeError of its zip writer, to an open file into an OSError without a file name.
    def save_to_full_disk(*_args: object, **_kwargs: object) -> None:
        state = {"w": torch.zeros(100_000)}
        if form == "path":
            torch.save(state, "/dev/full")
        with open("/dev/full", "wb") as f:  # noqa: PTH123 - as checkpoint.save_atomic writes
            torch.save(state, f)

    monkeypatch.setattr(pkg("engine.loop.trainer"), "train", save_to_full_disk)
    diagnostics = pkg("observe.diagnostics")
    usage = diagnostics.shutil.disk_usage(project)
    monkeypatch.setattr(diagnostics.shutil, "disk_usage", lambda _p: usage._replace(free=0))
    assert pkg("cli").main(["train", *TOY, "run.name=full"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {project / 'runs' / 'full'}: No space left on device"), line
