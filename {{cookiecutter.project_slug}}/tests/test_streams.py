"""Streams as train splits: positions per worker and process, exact resume, clear refusals."""

import csv
import importlib.util
import io
import shutil
import tarfile
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DIGITS, assert_identical, example_task, final_weights, pkg, run_cli
from toy_tasks.streams import Counted, Generated

streams, trainer = pkg("data.streams"), pkg("engine.trainer")
turns = pkg("engine.stream_batches").in_turns

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


def feed(stream, *, rank: int = 0, world: int = 1, resume=None) -> object:
    part = streams.StreamPart(rank, world, 0, 1)
    return streams.StreamFeed(
        stream, part, 0, 4, 0, torch.utils.data.default_collate, "test", resume=resume or {}
    )


def batches_of(pairs) -> list[torch.Tensor]:
    return [batch[0] for batch, tag in pairs if not tag.done]


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 3),
    stop=st.integers(0, 12),
    kind=st.sampled_from(["counted", "generated", "buffered"]),
    buffer=st.integers(1, 20),
)
def test_a_feed_resumed_from_any_tag_goes_on_as_if_never_stopped(
    world: int, stop: int, kind: str, buffer: int
) -> None:
    """Counting and skipping (no state) and a saved state (with a buffer) give the same rest."""

    def stream() -> object:
        return {
            "counted": lambda: Counted(97),
            "generated": lambda: Generated(97, split=False),
            "buffered": lambda: streams.ShuffleBuffer(Counted(97), buffer, seed=3),
        }[kind]()

    for rank in range(world):
        whole = list(feed(stream(), rank=rank, world=world))
        cut = list(islice(feed(stream(), rank=rank, world=world), stop))
        if not cut or cut[-1][1].done:
            continue
        rest = feed(stream(), rank=rank, world=world, resume={0: cut[-1][1].saved()})
        expected, got = batches_of(whole[len(cut) :]), batches_of(rest)
        assert len(expected) == len(got)
        for a, b in zip(expected, got, strict=True):
            assert torch.equal(a, b)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 40), stop=st.integers(0, 60), n=st.integers(0, 50))
def test_a_shuffle_buffer_resumes_with_its_contents(size: int, stop: int, n: int) -> None:
    whole = list(streams.ShuffleBuffer(range(n), size, seed=1))
    assert sorted(whole) == list(range(n))  # every sample once
    first = streams.ShuffleBuffer(range(n), size, seed=1)
    head = list(islice(iter(first), stop))
    again = streams.ShuffleBuffer(range(n), size, seed=1)
    again.load_state_dict(first.state_dict())
    assert head + list(again) == whole


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4), stop=st.integers(0, 20))
def test_turns_resume_from_the_next_worker(lengths: list[int], stop: int) -> None:
    """Workers of unequal lengths: a pass begun at the saved next worker goes on in order."""
    tag = pkg("data.streams").Tag

    def loader(skips: dict[int, int]) -> list:
        # What a DataLoader delivers: worker 0, 1, ... in turn, the done ones dropping out.
        queues = [
            [(f"{w}:{i}", tag(w, i + 1, i + 1)) for i in range(skips.get(w, 0), n)]
            + [(None, tag(w, n, n, done=True))]
            for w, n in enumerate(lengths)
        ]
        out = []
        while any(queues):
            out += [q.pop(0) for q in queues if q]
        return out

    whole = list(turns(iter(loader({})), len(lengths), 0))
    assert sorted(b for b, _ in whole) == sorted(
        f"{w}:{i}" for w, n in enumerate(lengths) for i in range(n)
    )
    head = whole[:stop]
    done = {t.worker: t.pulled for _, t in head}
    following = (head[-1][1].worker + 1) % len(lengths) if head else 0
    rest = list(turns(iter(loader(done)), len(lengths), following))
    assert [b for b, _ in head + rest] == [b for b, _ in whole]


def test_a_state_a_checkpoint_cannot_load_is_one_line() -> None:
    with pytest.raises(pkg("errors").DataError, match=r"numpy.ndarray at state\[0\]\['buf'\]"):
        import numpy as np  # noqa: PLC0415

        streams.check_state([{"buf": np.zeros(3)}], "task t: train stream")


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


def test_resume_with_another_worker_count_is_refused_naming_both(project: Path) -> None:
    train("run.name=w", "run.max_steps_this_segment=3")
    with pytest.raises(pkg("errors").DataError) as refused:
        train("run.name=w", "data.num_workers=1")
    assert "stream position of 2 worker(s) x 1 process(es)" in str(refused.value)
    assert "now 1 x 1" in str(refused.value) and "data.num_workers=2" in str(refused.value)


def test_workers_that_yield_the_same_samples_are_refused(project: Path) -> None:
    with pytest.raises(pkg("errors").DataError, match="workers 0 and 1 yielded the same first"):
        train("run.name=dup", "task.kind=unsplit")


def test_a_stream_that_raises_ends_the_run_with_its_traceback(project: Path) -> None:
    out = run_cli("train", *COMMON, "run.name=bad", "task.kind=raise", project=project)
    assert out.returncode == 1
    assert "sensor 50 is unreadable" in out.stdout + out.stderr
    assert "toy_tasks/streams.py" in out.stdout + out.stderr  # where the task raised
    assert not (project / "runs" / "bad" / "checkpoints").exists() or not any(
        (project / "runs" / "bad" / "checkpoints").iterdir()
    )


def test_cosine_without_an_end_is_refused(project: Path) -> None:
    with pytest.raises(pkg("errors").ConfigError, match=r"set train\.max_steps"):
        train("run.name=cos", "train.schedule=cosine")
    ended = train("run.name=ends", "train.schedule=cosine", "train.max_steps=9")
    assert (ended.summary["status"], ended.summary["step"]) == ("finished", 9)
    assert ended.summary["total_steps"] == 9


def test_a_changed_source_file_is_named_on_resume(project: Path) -> None:
    """Files a stream reads from outside data/processed are in the checkpoint's digest."""
    if not HAS_DATASETS:
        pytest.skip("the datasets extra is not installed")
    task = load("task.kind=hf")
    pkg("data.processed").prepare(task)
    external = project / "data" / "external" / "streams"
    shutil.copytree(task.processed_dir, external)
    options = ["task.kind=hf", "task.shuffle=false", "task.external=true"]
    train("run.name=src", "run.max_steps_this_segment=3", *options)
    shard = external / "train-2.parquet"
    shard.write_bytes(shard.read_bytes() + b"\0")  # changed behind the run's back
    with pytest.raises(pkg("errors").DataError, match=r"external/streams/train-2.parquet changed"):
        train("run.name=src", *options)


names = st.text(alphabet="abcdefghij_-", min_size=1, max_size=120)
fields = st.dictionaries(
    st.sampled_from(["x", "y.png", "cls"]), st.binary(max_size=700), min_size=1
)


@settings(max_examples=30, deadline=None)
@given(
    samples=st.lists(st.tuples(names, fields), max_size=6, unique_by=lambda sample: sample[0]),
    form=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_the_tar_reader_reads_what_tarfile_writes(
    samples: list, form: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Long names (GNU, pax), folders and every size come back as the same samples."""
    path = tmp_path_factory.mktemp("tar") / "shard.tar"
    if form == tarfile.USTAR_FORMAT:  # ustar: names of up to 100 bytes
        samples = list({key[:90]: (key[:90], fields) for key, fields in samples}.values())
    with tarfile.open(path, "w", format=form) as tar:
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a file: skipped
        for key, parts in samples:
            for field, data in parts.items():
                info = tarfile.TarInfo(f"d/{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    read = list(pkg("data.tars").read_tar(path))
    assert read == [{"__key__": f"d/{key}", **parts} for key, parts in samples]


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
