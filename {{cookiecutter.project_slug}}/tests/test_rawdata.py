"""`data freeze` / `data verify` on real files: every kind of change is named exactly."""

from __future__ import annotations

import argparse
import logging
import os
import stat
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = next((ROOT / "src").glob("*/data/rawdata.py")).parent.parent.name
rawdata = import_module(f"{PACKAGE}.data.rawdata")
RawDataError = rawdata.RawDataError

FILES = {
    "labels.csv": b"id,label\n1,cat\n2,dog\n",
    "images/0001.bin": bytes(range(256)) * 4,
    "images/0002.bin": b"\x00\xff" * 300,
    "notes/source.txt": b"delivered 2024-05-01 by the lab\n",
}


def run_data(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    """Run `data ARGS` through the parser that add_data_command builds."""
    parser = argparse.ArgumentParser()
    rawdata.add_data_command(parser.add_subparsers(dest="command", required=True))
    namespace = parser.parse_args(["data", *args])
    code = namespace.func(namespace)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a frozen raw data set; the working directory is its root."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("DATA_DIR", raising=False)
    raw = tmp_path / "data" / "raw"
    for rel, content in FILES.items():
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        (raw / rel).write_bytes(content)
        (raw / rel).chmod(0o644)  # the same modes under any umask
    (raw / ".gitkeep").touch()
    (raw / "images" / "0002.bin").chmod(0o755)
    rawdata.freeze(Path("data/raw"), Path(rawdata.MANIFEST_PATH), update=False)
    return tmp_path


def changes(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    code, lines, _ = run_data(capsys, "verify", *extra)
    return code, lines


def test_freeze_records_every_file_and_removes_write_bits(project: Path) -> None:
    lines = (project / "data" / "raw.manifest.tsv").read_text().splitlines()
    assert lines[0] == "path\tsize\tmode\tsha256"
    recorded = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert sorted(recorded) == sorted(FILES)  # .gitkeep is not data
    assert recorded["labels.csv"][1:3] == [str(len(FILES["labels.csv"])), "0444"]
    assert recorded["images/0002.bin"][2] == "0555"  # execute bits kept, write bits gone
    for rel in FILES:
        mode = (project / "data" / "raw" / rel).stat().st_mode
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), rel


def test_first_freeze_reports_a_count_not_every_file(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = project / "data" / "raw.manifest.tsv"
    recorded = manifest.read_bytes()
    manifest.unlink()
    code, lines, _ = run_data(capsys, "freeze")
    assert (code, lines) == (
        0,
        ["recorded 4 raw files (0.0 MiB) in data/raw.manifest.tsv, now read-only"],
    )
    assert manifest.read_bytes() == recorded


def test_untouched_tree_verifies_clean(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert changes(capsys) == (0, ["data/raw: all files match data/raw.manifest.tsv"])
    assert changes(capsys, "--full")[0] == 0


@contextmanager
def writable(path: Path) -> Iterator[Path]:
    """Lift the read-only mode for one write (root ignores it, everyone else does not)."""
    mode = stat.S_IMODE(path.stat().st_mode)
    path.chmod(mode | stat.S_IWUSR)
    try:
        yield path
    finally:
        path.chmod(mode)


def _modify(raw: Path) -> None:
    with writable(raw / "labels.csv") as path:
        path.write_bytes(path.read_bytes().replace(b"cat", b"cow"))  # same size


def _truncate(raw: Path) -> None:
    with writable(raw / "images" / "0001.bin") as path:
        os.truncate(path, 10)


def _delete(raw: Path) -> None:
    (raw / "notes" / "source.txt").unlink()


def _add(raw: Path) -> None:
    (raw / "images" / "0003.bin").write_bytes(b"new")


def _rename(raw: Path) -> None:
    (raw / "images" / "0001.bin").rename(raw / "images" / "first.bin")


def _chmod(raw: Path) -> None:
    (raw / "labels.csv").chmod(0o644)


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (_modify, "modified    data/raw/labels.csv (content differs)"),
        (_truncate, "modified    data/raw/images/0001.bin (size 1024 -> 10)"),
        (_delete, "missing     data/raw/notes/source.txt"),
        (_add, "added       data/raw/images/0003.bin"),
        (_rename, "renamed     data/raw/images/0001.bin -> data/raw/images/first.bin"),
        (_chmod, "permissions data/raw/labels.csv (mode 0644, manifest 0444)"),
    ],
    ids=["modify", "truncate", "delete", "add", "rename", "chmod"],
)
@pytest.mark.parametrize("full", [False, True], ids=["cached", "full"])
def test_verify_names_exactly_the_changed_file(
    project: Path, capsys: pytest.CaptureFixture[str], tamper, expected: str, full: bool
) -> None:
    assert changes(capsys)[0] == 0  # fills the cache, so the cached run must see through it
    tamper(project / "data" / "raw")
    code, lines, err = run_data(capsys, "verify", *(["--full"] if full else []))
    assert (code, lines) == (1, [expected])
    assert "1 difference(s)" in err
    assert "data freeze --update" in err


def test_cache_sees_a_write_that_restores_mtime(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project / "data" / "raw" / "labels.csv"
    assert changes(capsys)[0] == 0
    before = path.stat()
    _modify(path.parent)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # like `touch -r` or rsync -t
    assert changes(capsys) == (1, ["modified    data/raw/labels.csv (content differs)"])


def test_second_verify_reads_no_file_but_full_reads_all(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[str] = []
    real = rawdata.sha256_file

    def counting(path: Path, *args) -> str:
        hashed.append(path.name)
        return real(path, *args)

    monkeypatch.setattr(rawdata, "sha256_file", counting)
    assert changes(capsys)[0] == 0  # the cache was filled by freeze
    assert hashed == []
    assert changes(capsys, "--full")[0] == 0
    assert sorted(hashed) == sorted(Path(rel).name for rel in FILES)
    assert (project / "data" / ".raw-cache.json").is_file()


@pytest.mark.parametrize(
    "cache_text",
    [
        '{"version": 1, "root": "ROOT", "files": {"labels.csv": 5}}',
        '{"version": 1, "root": "ROOT", "files": []}',
        "not json",
    ],
    ids=["entry-not-a-list", "files-not-a-dict", "garbage"],
)
def test_damaged_cache_is_ignored_not_trusted(
    project: Path, capsys: pytest.CaptureFixture[str], cache_text: str
) -> None:
    root = str((project / "data" / "raw").resolve())
    (project / "data" / ".raw-cache.json").write_text(cache_text.replace("ROOT", root))
    _modify(project / "data" / "raw")
    assert changes(capsys) == (1, ["modified    data/raw/labels.csv (content differs)"])
    assert changes(capsys, "--full")[0] == 1


def test_freeze_update_says_what_changed_and_records_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = project / "data" / "raw"
    _add(raw)
    _delete(raw)
    _modify(raw)
    code, lines, _ = run_data(capsys, "freeze", "--update")
    assert code == 0
    assert lines == [
        "added       data/raw/images/0003.bin",
        "modified    data/raw/labels.csv (content differs)",
        "removed     data/raw/notes/source.txt",
        "data/raw.manifest.tsv: 3 change(s) recorded",
    ]
    assert not (raw / "images" / "0003.bin").stat().st_mode & stat.S_IWUSR
    assert changes(capsys)[0] == 0
    code, lines, _ = run_data(capsys, "freeze", "--update")
    assert lines == ["data/raw.manifest.tsv: no change(s) recorded"]


def test_freeze_without_update_never_rewrites_the_manifest(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = project / "data" / "raw.manifest.tsv"
    before = manifest.read_bytes()
    _add(project / "data" / "raw")
    code, _, err = run_data(capsys, "freeze")
    assert code == 1
    assert err.count("\n") == 1
    assert "added data/raw/images/0003.bin" in err
    assert "data freeze --update" in err
    assert manifest.read_bytes() == before


def test_unrecordable_file_name_stops_freeze_before_any_change(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = project / "data" / "raw.manifest.tsv"
    before = manifest.read_bytes()
    odd = project / "data" / "raw" / "tab\tname.csv"
    odd.write_text("x\n")
    odd.chmod(0o644)
    code, _, err = run_data(capsys, "freeze", "--update")
    assert (code, err) == (
        1,
        "error: raw file name 'tab\\tname.csv' contains a tab or newline; rename it\n",
    )
    assert manifest.read_bytes() == before
    assert stat.S_IMODE(odd.stat().st_mode) == 0o644


def test_freeze_restores_recorded_permissions(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = project / "data" / "raw"
    (raw / "labels.csv").chmod(0o664)
    (raw / "images" / "0002.bin").chmod(0o775)
    code, lines, _ = run_data(capsys, "freeze")
    assert code == 0
    assert lines[-1] == "data/raw.manifest.tsv unchanged; 2 file(s) made read-only again"
    assert stat.S_IMODE((raw / "labels.csv").stat().st_mode) == 0o444
    assert stat.S_IMODE((raw / "images" / "0002.bin").stat().st_mode) == 0o555
    assert changes(capsys)[0] == 0


def test_verify_raw_raises_one_line_naming_the_file(project: Path) -> None:
    _truncate(project / "data" / "raw")
    _delete(project / "data" / "raw")
    with pytest.raises(RawDataError) as caught:
        rawdata.verify_raw(Path("data/raw"), Path("data/raw.manifest.tsv"))
    message = str(caught.value)
    assert "\n" not in message
    assert "modified data/raw/images/0001.bin (size 1024 -> 10)" in message
    assert "missing data/raw/notes/source.txt" in message


def test_verify_raw_only_warns_about_permissions(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _chmod(project / "data" / "raw")
    with caplog.at_level(logging.WARNING):
        rawdata.verify_raw(Path("data/raw"), Path("data/raw.manifest.tsv"))
    assert "data freeze` makes them read-only again" in caplog.text


def test_missing_manifest_and_missing_folder_are_one_line_errors(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_data(capsys, "verify", "--raw-dir", "elsewhere")
    assert (code, err) == (1, "error: raw-data folder elsewhere does not exist\n")
    (project / "data" / "raw.manifest.tsv").unlink()
    code, _, err = run_data(capsys, "verify")
    assert code == 1
    assert err.startswith("error: no manifest at data/raw.manifest.tsv;")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("path,size\n", ":1: header"),
        ("path\tsize\tmode\tsha256\na.csv\t3\t0444\n", ":2: expected path, size"),
        ("path\tsize\tmode\tsha256\na.csv\t3\t644\t" + "0" * 64 + "\n", ":2: expected path"),
        ("path\tsize\tmode\tsha256\n../a\t3\t0444\t" + "0" * 64 + "\n", ":2: path '../a'"),
    ],
    ids=["header", "fields", "mode", "escape"],
)
def test_bad_manifest_is_rejected_with_its_line(text: str, error: str) -> None:
    manifest = import_module(f"{PACKAGE}.data.manifest")
    with pytest.raises(RawDataError, match=error):
        manifest.parse_manifest(text, "m.tsv")


def test_data_dir_moves_the_raw_folder_but_not_the_manifest(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = project / "scratch"
    (project / "data").rename(scratch)
    (project / "data").mkdir()
    (scratch / "raw.manifest.tsv").rename(project / "data" / "raw.manifest.tsv")
    monkeypatch.setenv("DATA_DIR", str(scratch))
    assert changes(capsys) == (0, ["scratch/raw: all files match data/raw.manifest.tsv"])


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``root``: its content and permission bits."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_freeze_writes_its_manifest_and_write_bits_only(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit of a writing command: `data freeze --update` changes the manifest, its digest
    cache and the write bits of the raw files it records, nothing else, and a failure to write
    the manifest leaves everything as it was, with no temporary file behind."""
    (project / "data" / "notes.txt").write_text("mine\n", "utf-8")  # beside the manifest
    raw = project / "data" / "raw"
    _add(raw)
    before = _tree(project)

    def refuse(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "replace", refuse)
        with pytest.raises(OSError, match="No space left"):
            rawdata.freeze(Path("data/raw"), Path(rawdata.MANIFEST_PATH), update=True)
    assert _tree(project) == before
    code, _, _ = run_data(capsys, "freeze", "--update")
    assert code == 0
    after = _tree(project)
    changed = {rel for rel in before.keys() | after.keys() if before.get(rel) != after.get(rel)}
    manifest, added = Path(rawdata.MANIFEST_PATH).as_posix(), "data/raw/images/0003.bin"
    assert changed == {manifest, added, f"data/{rawdata.CACHE_NAME}"}, changed
    assert after[added] == (before[added][0], before[added][1] & ~0o222)  # only its write bits
