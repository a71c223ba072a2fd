"""The source record: files streams read from outside data/processed, recorded at first use."""

import errno
import hashlib
import importlib.util
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import PACKAGE, pkg

sources, cli = pkg("data.sources"), pkg("cli")
HEADER = "path\tsize\tsha256"
RECORD = "data/sources.manifest.tsv"  # as named from the project root
# The toy stream task over parquet files in DATA_DIR/external/streams (the datasets extra).
HF = [
    "run.progress=log",
    "run.figures=false",
    "data.verify_raw=false",
    "task.name=toy_tasks.streams",
    "task.kind=hf",
    "task.shuffle=false",
    "task.external=true",
    "data.num_workers=0",
    "train.batch_size=16",
    "train.schedule=constant",
    "train.epochs=1",
]


@pytest.fixture
def here(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project, as the working directory (messages name paths relative to it)."""
    monkeypatch.chdir(project)
    return project


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def line(path: Path, name: str) -> str:
    """The record's line for the file at `path`, recorded as `name`."""
    return f"{name}\t{path.stat().st_size}\t{sha256(path)}"


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def train(*overrides: str) -> Any:
    """Train the toy stream task in this process."""
    cfg = pkg("task").load_config(None, [*HF, *overrides])
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    return pkg("engine.loop.trainer").train(task.cfg, task)


@pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="the datasets extra is not installed"
)
def test_a_first_run_records_and_a_run_of_another_name_refuses_a_changed_file(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = pkg("task").load_config(None, HF)
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    pkg("data.processed").prepare(task)
    streams = here / "data" / "external" / "streams"
    shutil.copytree(task.processed_dir, streams)
    shards = sorted(streams.glob("*.parquet"))

    assert train("run.name=first", "run.max_steps_this_segment=2").summary["step"] == 2
    assert f"recorded 4 new source file(s) in {RECORD} (commit it)" in capsys.readouterr().out
    expected = [HEADER] + [line(p, f"external/streams/{p.name}") for p in shards]
    assert (here / RECORD).read_text().splitlines() == expected

    shard = streams / "train-1.parquet"
    before = shard.stat().st_size
    shutil.copyfile(streams / "train-0.parquet", shard)  # swapped: still a parquet file
    after = shard.stat().st_size
    differs = "content differs" if after == before else f"size {before} -> {after}"
    capsys.readouterr()
    assert cli.main(["train", *HF, "run.name=second"]) == 1
    refused = capsys.readouterr()
    assert "Traceback" not in refused.out + refused.err
    assert refused.err.splitlines() == [
        (
            f"error: source file data/external/streams/train-1.parquet ({differs}) differs "
            f"from its record in {RECORD}; if the change is intended, record it with "
            f"`{PACKAGE} data record --update data/external/streams/train-1.parquet`"
        )
    ]
    assert (here / RECORD).read_text().splitlines() == expected  # nothing recorded

    assert cli.main(["data", "record", "--update", "data/external/streams/train-1.parquet"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"modified    data/external/streams/train-1.parquet ({differs})",
        f"updated {RECORD}: 1 changed source file(s) (commit it)",
    ]
    expected[2] = line(shard, "external/streams/train-1.parquet")
    assert (here / RECORD).read_text().splitlines() == expected
    assert train("run.name=second", "run.max_steps_this_segment=1").summary["step"] == 1


def unread(path: Path, *_: Any) -> str:
    raise AssertionError(f"{path} was read: its sum is cached")


def test_a_folder_is_recorded_before_any_run_and_checked_after_a_copy(
    here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = here / "data" / "external" / "corpus"
    a = write(corpus / "a.parquet", b"twelve bytes")
    b = write(corpus / "part" / "b.parquet", b"more rows")
    write(corpus / ".cache" / "index.json", b"{}")  # hidden: not data
    write(here / "data" / "external" / ".gitkeep", b"")
    assert cli.main(["data", "record"]) == 0  # DATA_DIR/external
    assert capsys.readouterr().out == f"recorded 2 new source file(s) in {RECORD} (commit it)\n"
    expected = [HEADER, line(a, "external/corpus/a.parquet")]
    expected.append(line(b, "external/corpus/part/b.parquet"))
    assert (here / RECORD).read_text().splitlines() == expected

    with monkeypatch.context() as patched:  # a repeated check reads no file's bytes
        patched.setattr(pkg("data.rawdata"), "sha256_file", unread)
        assert cli.main(["data", "check"]) == 0
    assert capsys.readouterr().out == f"all 2 files match {RECORD}\n"

    a.write_bytes(b"cut in the copy")
    b.unlink()
    assert cli.main(["data", "check"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "modified    data/external/corpus/a.parquet (size 12 -> 15)",
        "missing     data/external/corpus/part/b.parquet",
    ]
    assert err == (
        f"2 of 2 source file(s) differ from {RECORD}; if intended, record them with "
        f"`{PACKAGE} data record --update PATH ...`\n"
    )

    assert cli.main(["data", "record", "data/external"]) == 1  # a change needs --update
    assert capsys.readouterr().err == (
        f"error: source file data/external/corpus/a.parquet (size 12 -> 15) differs from its "
        f"record in {RECORD}; if the change is intended, record it with "
        f"`{PACKAGE} data record --update data/external/corpus/a.parquet`\n"
    )
    assert (here / RECORD).read_text().splitlines() == expected

    assert cli.main(["data", "record", "--update", "data/external/corpus"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"updated {RECORD}: 1 changed, 1 removed source file(s) (commit it)"
    )
    assert (here / RECORD).read_text().splitlines() == [
        HEADER,
        line(a, "external/corpus/a.parquet"),
    ]
    assert cli.main(["data", "check", "--full"]) == 0
    assert capsys.readouterr().out == f"all 1 files match {RECORD}\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["record", "data/nowhere"], "error: data/nowhere: no such file or folder"),
        (["record"], "error: data/external: no such file or folder"),
        (["check"], f"error: no source record at {RECORD}; `{PACKAGE} data record` records the"),
    ],
    ids=["record-a-bad-path", "record-no-external-folder", "check-without-a-record"],
)
def test_a_bad_path_is_one_line(
    here: Path, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    assert cli.main(["data", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(error) and err.count("\n") == 1
    assert not (here / RECORD).exists()


def test_a_damaged_record_is_one_line_naming_its_line(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(here / RECORD, f"{HEADER}\nexternal/a.bin\t3\n".encode())
    assert cli.main(["data", "check"]) == 1
    assert capsys.readouterr().err == (
        f"error: {RECORD}:2: expected path, size and sha256, tab-separated\n"
    )


def test_files_below_data_dir_are_named_from_it_and_others_by_their_path(
    here: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("DATA_DIR", str(here / "scratch"))  # the record stays in the project
    inside = write(here / "scratch" / "external" / "x.bin", b"x")
    outside = write(tmp_path_factory.mktemp("shared") / "y.bin", b"y")
    assert cli.main(["data", "record", str(inside), str(outside)]) == 0
    recorded = (here / RECORD).read_text().splitlines()
    assert recorded == [
        HEADER,
        line(outside, str(outside.resolve())),
        line(inside, "external/x.bin"),
    ]
    assert cli.main(["data", "check"]) == 0


def test_a_read_only_project_still_checks_and_records_nothing(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, record = here / "data", here / RECORD
    a = write(data_dir / "external" / "a.bin", b"a")
    sources.record_files([a], data_dir, record, update=False)
    before = record.read_bytes()
    b = write(data_dir / "external" / "b.bin", b"b")
    opened = os.open

    def read_only(path: Any, flags: int, *args: Any) -> int:
        """The project's data/ on a read-only file system (root writes even to mode 0555)."""
        if Path(path).parent == record.parent and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return int(opened(path, flags, *args))

    monkeypatch.setattr(os, "open", read_only)
    found = sources.fingerprint([a, b], data_dir)
    sources.check_record(found, record, data_dir)  # b is new: it passes
    assert sources.record_new(found, record) == (
        f"warning: 1 new source file(s) not recorded: {RECORD} cannot be written: "
        f"{os.strerror(errno.EROFS)}"
    )
    assert record.read_bytes() == before
    a.write_bytes(b"A")
    with pytest.raises(pkg("errors").DataError, match=r"source file data/external/a.bin \("):
        sources.check_record(sources.fingerprint([a, b], data_dir), record, data_dir)


def test_two_runs_starting_together_lose_no_entry(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run "a" is between reading and writing the record when run "b" reads it and waits."""
    data_dir, record = here / "data", here / RECORD
    files = {name: write(data_dir / "external" / f"{name}.bin", name.encode()) for name in "ab"}
    found = {name: sources.fingerprint([path], data_dir) for name, path in files.items()}
    a_writes, b_waits, go = threading.Event(), threading.Event(), threading.Event()
    write_sources, locked = sources.write_sources, sources._locked

    def paused_write(path: Path, entries: Any) -> None:
        if threading.current_thread().name == "a":
            a_writes.set()
            assert go.wait(timeout=300)  # a hang guard, not a timing
        write_sources(path, entries)

    def announced_lock(path: Path) -> Any:
        if threading.current_thread().name == "b":
            b_waits.set()
        return locked(path)

    monkeypatch.setattr(sources, "write_sources", paused_write)
    monkeypatch.setattr(sources, "_locked", announced_lock)
    said: dict[str, str | None] = {}

    def run(name: str) -> None:
        said[name] = sources.record_new(found[name], record)

    first = threading.Thread(target=run, args=("a",), name="a")
    first.start()
    assert a_writes.wait(timeout=300)
    second = threading.Thread(target=run, args=("b",), name="b")
    second.start()
    assert b_waits.wait(timeout=300)  # "b" found the record without its file
    go.set()
    first.join()
    second.join()
    news = f"recorded 1 new source file(s) in {RECORD} (commit it)"
    assert said == {"a": news, "b": news}
    assert record.read_text().splitlines() == [
        HEADER,
        line(files["a"], "external/a.bin"),
        line(files["b"], "external/b.bin"),
    ]
