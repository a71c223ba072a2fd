"""Streams as train splits: positions per worker and process, exact resume, clear refusals."""

import csv
import importlib.util
import io
import pickle
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import (
    DIGITS,
    CliHere,
    assert_identical,
    example_task,
    final_weights,
    pkg,
    run_cli,
    run_ranks,
)

streams, trainer = pkg("data.streams"), pkg("engine.loop.trainer")

# Two workers, batches of 16, a constant schedule (a stream has no planned end).
COMMON = [
    "run.progress=log",
    "run.figures=false",
    "data.verify_raw=false",
    "run.log_every_steps=5",
    "task.name=toy_tasks.streams",
    "data.num_workers=2",
    "train.batch_size=16",
    "train.schedule=constant",
    "train.epochs=2",
]
HAS_DATASETS = importlib.util.find_spec("datasets") is not None


def test_a_state_a_checkpoint_cannot_load_is_one_line() -> None:
    with pytest.raises(pkg("errors").DataError, match=r"numpy.ndarray at state\[0\]\['buf'\]"):
        import numpy as np  # noqa: PLC0415

        streams.check_state([{"buf": np.zeros(3)}], "task t: train stream")


def test_a_stream_its_workers_cannot_receive_is_one_line() -> None:
    """Workers come from a fork server: the stream goes to them pickled."""

    class Local(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            yield from range(4)

    stream_batches, denv = (
        pkg("engine.loop.stream_batches"),
        pkg("engine.parallel.distributed").DistEnv(),
    )
    options: dict[str, Any] = {"batch_size": 2, "denv": denv, "seed": 0, "collate": None}
    options |= {"device": torch.device("cpu"), "prefetch": 2}
    loading = pkg("engine.loop.loading").Loading
    with pytest.raises(pkg("errors").DataError) as refused:
        stream_batches.StreamBatches(Local(), loading(workers=2, **options), where="task t: train")
    assert str(refused.value).startswith("task t: train: cannot be sent to its DataLoader")
    assert "Local" in str(refused.value) and "data.num_workers=0" in str(refused.value)
    alone = stream_batches.StreamBatches(Local(), loading(workers=0, **options), where="t")
    assert alone.context is None


def test_workers_receive_the_task_without_its_training_state() -> None:
    """A task's `collate` (a method) takes the task to the workers, not its averaged weights."""
    task = load()
    task.averaged = pkg("api").EMA(0.9)
    task.averaged.attach(torch.nn.Linear(64, 64))
    task.where = pkg("task").Where(3, 0, None)
    sent = pickle.loads(pickle.dumps(task.collate))  # noqa: S301  (as the workers get it)
    assert sent.__self__.averaged is None and task.averaged.tensors
    assert sent.__self__.options == task.options and sent.__self__.where.step == 3


def load(*overrides: str) -> Any:
    cfg = pkg("task").load_config(None, [*COMMON, *overrides])
    return pkg("task").load_task(cfg, pkg("settings").get_settings())


def train(*overrides: str) -> Any:
    """Train in this process (the DataLoader workers are processes of their own)."""
    task = load(*overrides)
    return trainer.train(task.cfg, task)


def stop_and_resume(project: Path, *args: str, steps: int = 7) -> None:
    """A whole run and a run cut mid-epoch then resumed end on the same weights."""
    whole = train("run.name=whole", *args)
    assert whole.summary["status"] == "finished" and whole.summary["total_steps"] is None
    cut = train("run.name=cut", f"run.max_steps_this_segment={steps}", *args)
    assert cut.summary["status"] == "segment" and cut.summary["step"] == steps
    rest = train("run.name=cut", *args)
    assert rest.summary["status"] == "finished"
    assert rest.summary["step"] == whole.summary["step"]
    runs = project / "runs"
    assert_identical(final_weights(runs / "whole"), final_weights(runs / "cut"))


@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_a_stream_with_two_workers_resumes_exactly(project: Path, kind: str) -> None:
    stop_and_resume(project, f"task.kind={kind}")
    with (project / "runs" / "whole" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    val = [row for row in rows if row["phase"] == "val"]
    assert [row["epoch"] for row in val] == ["0", "1"]  # validated at each epoch's end


@pytest.mark.skipif(not HAS_DATASETS, reason="the datasets extra is not installed")
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled-replay", "own-state"])
def test_a_hugging_face_stream_resumes_exactly(project: Path, shuffle: bool) -> None:
    options = ["task.kind=hf", f"task.shuffle={str(shuffle).lower()}"]
    pkg("data.processed").prepare(load(*options))
    stop_and_resume(project, *options)


@pytest.mark.skipif(not HAS_DATASETS, reason="the datasets extra is not installed")
def test_a_datasets_stream_shuffled_through_its_own_buffer_is_refused_at_the_start(
    project: Path, cli_here: CliHere
) -> None:
    """Its state holds no buffer contents, and its resume died in a worker: never trained."""
    pkg("data.processed").prepare(load("task.kind=hf"))
    out = cli_here("train", *COMMON, "task.name=toy_tasks.hf_as_is", "run.name=as-is")
    assert out.returncode == 1
    assert "Traceback" not in out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("error: task toy_tasks.hf_as_is: train: a Hugging Face datasets ")
    assert "hf_stream(files, shuffle_buffer=N, seed=...)" in line
    assert not (project / "runs" / "as-is" / "checkpoints").exists()


@pytest.mark.skipif(not HAS_DATASETS, reason="the datasets extra is not installed")
def test_a_datasets_stream_handed_over_unshuffled_resumes_exactly(project: Path) -> None:
    pkg("data.processed").prepare(load("task.kind=hf"))
    stop_and_resume(project, "task.name=toy_tasks.hf_as_is", "task.shuffle=false")


def stop_and_resume_on_two(project: Path, args: list[str], steps: int) -> None:
    """As `stop_and_resume`, with 2 processes started by torchrun (each run a new process)."""
    segment = f"run.max_steps_this_segment={steps}"
    for run in (["run.name=whole"], ["run.name=cut", segment], ["run.name=cut"]):
        out = run_cli("train", *args, *run, project=project, torchrun=2)
        assert out.returncode == 0, out.stdout + out.stderr
    assert f"resumed from step {steps}" in out.stdout
    runs = project / "runs"
    assert_identical(final_weights(runs / "whole"), final_weights(runs / "cut"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("plain", ["train.grad_accum_steps=2"]),
        ("stateful", ["dist.strategy=fsdp", "run.async_checkpoint=true"]),
        ("hf", ["train.grad_accum_steps=2"]),
    ],
)
def test_a_stream_on_two_processes_resumes_exactly(
    project: Path, kind: str, extra: list[str]
) -> None:
    """ddp and fsdp, background saves: every process's workers keep their own positions."""
    if kind == "hf" and not HAS_DATASETS:
        pytest.skip("the datasets extra is not installed")
    args = [*COMMON, f"task.kind={kind}", *extra, "run.checkpoint_every_steps=2"]
    if kind == "hf":
        assert run_cli("prepare", *args, project=project).returncode == 0
    stop_and_resume_on_two(project, args, steps=5)


@pytest.mark.slow
def test_the_tar_example_on_two_processes_resumes_exactly(project: Path) -> None:
    """The shipped `stream` task: whole tar shards per process and worker, a shuffle buffer."""
    if not example_task("stream"):
        pytest.skip("the stream example is not part of this project (any more)")
    (project / "data" / "raw").mkdir(parents=True)
    shutil.copy(DIGITS, project / "data" / "raw")
    args = [*COMMON[:4], "task.name=stream", "train.schedule=constant", "train.epochs=2"]
    args += ["model.hidden=32", "task.buffer=32", "data.num_workers=2", "train.batch_size=32"]
    assert run_cli("prepare", *args, project=project).returncode == 0
    stop_and_resume_on_two(project, args, steps=6)


@pytest.mark.slow
def test_a_stream_resumed_on_another_process_count_says_the_one_cause_on_every_rank(
    project: Path,
) -> None:
    """A 1-process run resumed on 2: rank 1 holds no position of its own, and says why."""
    args = [*COMMON, "task.kind=stateful", "run.name=grow"]
    out = run_cli("train", *args, "run.max_steps_this_segment=3", project=project)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in run_ranks(project, "train", *args):
        assert rank.returncode == 1 and "Traceback" not in rank.stdout + rank.stderr, rank.stderr
        [line] = [line for line in rank.stderr.splitlines() if line.startswith("error")]
        assert "stopped at a stream position of 2 worker(s) x 1 process(es), batch 16; now " in line
        assert "2 x 2, batch 16: resume with data.num_workers=2, 1 process(es)" in line


def test_resume_with_another_worker_count_is_refused_naming_both(project: Path) -> None:
    train("run.name=w", "run.max_steps_this_segment=3")
    with pytest.raises(pkg("errors").DataError) as refused:
        train("run.name=w", "data.num_workers=1")
    assert "stream position of 2 worker(s) x 1 process(es)" in str(refused.value)
    assert "now 1 x 1" in str(refused.value) and "data.num_workers=2" in str(refused.value)


def test_workers_that_yield_the_same_samples_are_refused(project: Path) -> None:
    with pytest.raises(pkg("errors").DataError, match="workers 0 and 1 yielded the same first"):
        train("run.name=dup", "task.kind=unsplit")


def test_a_stream_that_raises_ends_the_run_in_one_line_and_keeps_its_steps(
    project: Path,
) -> None:
    """The task's own error in a worker: one line, its traceback in the run's errors.log."""
    out = run_cli("train", *COMMON, "run.name=bad", "task.kind=raise", project=project)
    assert out.returncode == pkg("engine.loop.read_stop").EXIT_DATA == 6
    [line] = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    assert "RuntimeError: sensor 50 is unreadable, in DataLoader worker 0 of process 0" in line
    assert "checkpoint at step 2 written, exit 6" in line  # worker 0 failed in its 2nd batch
    assert "Traceback" not in out.stdout + out.stderr
    log = (project / "runs" / "bad" / "errors.log").read_text(encoding="utf-8")
    assert "Traceback" in log and "toy_tasks/streams.py" in log  # where the task raised
    assert final_weights(project / "runs" / "bad")  # the two good steps are kept


def test_cosine_without_an_end_is_refused(project: Path) -> None:
    with pytest.raises(pkg("errors").ConfigError, match=r"set train\.max_steps"):
        train("run.name=cos", "train.schedule=cosine")
    ended = train("run.name=ends", "train.schedule=cosine", "train.max_steps=9")
    assert (ended.summary["status"], ended.summary["step"]) == ("finished", 9)
    assert ended.summary["total_steps"] == 9


def test_a_changed_source_file_is_named_on_resume(project: Path) -> None:
    """Files a stream reads from outside data/processed are in the source record (checked
    first, tests/test_source_record.py) and in the checkpoint's digest."""
    if not HAS_DATASETS:
        pytest.skip("the datasets extra is not installed")
    task = load("task.kind=hf")
    pkg("data.processed").prepare(task)
    external = project / "data" / "external" / "streams"
    shutil.copytree(task.processed_dir, external)
    options = ["task.kind=hf", "task.shuffle=false", "task.external=true"]
    train("run.name=src", "run.max_steps_this_segment=3", *options)
    shard = external / "train-2.parquet"
    shutil.copyfile(external / "train-3.parquet", shard)  # swapped behind the run's back
    with pytest.raises(pkg("errors").DataError) as refused:
        train("run.name=src", *options)
    message = str(refused.value)
    assert "\n" not in message and "data record --update" in message
    assert re.search(r"source file \S*external/streams/train-2.parquet \(", message)
    # Recorded on purpose: the run's checkpoint still names the file it was trained on.
    record = project / pkg("data.sources").RECORD_PATH
    pkg("data.sources").record_files([shard], project / "data", record, update=True)
    with pytest.raises(pkg("errors").DataError, match=r"external/streams/train-2.parquet changed"):
        train("run.name=src", *options)


def test_a_cut_tar_file_is_one_line(tmp_path: Path) -> None:
    tars = pkg("data.tars")
    [path] = tars.write_tar_shards([{"__key__": "a", "x": b"1" * 3000}], tmp_path, "s", 10)
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(pkg("errors").DataError, match=r"s-000000\.tar: cut short"):
        list(tars.read_tar(path))
    path.write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(pkg("errors").DataError, match=r"not a tar file, or damaged at byte 0"):
        list(tars.read_tar(path))
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a" * 150 + ".x")  # a long name: a pax header before it
        tar.addfile(info, io.BytesIO(b""))
    data = bytearray(path.read_bytes())
    data[512:514] = b"zz"  # the first record's length
    path.write_bytes(bytes(data))
    with pytest.raises(pkg("errors").DataError, match=r"a damaged pax header at byte 512"):
        list(tars.read_tar(path))
