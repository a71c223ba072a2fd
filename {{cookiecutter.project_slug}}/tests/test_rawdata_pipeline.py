"""`prepare` and `train` check the raw data first; the example pipeline never touches it."""

from __future__ import annotations

import os
import shutil
import stat
from importlib import import_module
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = next((ROOT / "src").glob("*/data/rawdata.py")).parent.parent.name
cli = import_module(f"{PACKAGE}.cli")
rawdata = import_module(f"{PACKAGE}.data.rawdata")
# Only the small example file is copied, never the project's own (maybe huge) raw data.
EXAMPLE = ROOT / "data" / "raw" / "digits.csv.gz"
HAS_EXAMPLE = EXAMPLE.is_file() and (ROOT / "src" / PACKAGE / "tasks" / "digits.py").is_file()
DATASET = ["task.name=digits"] if HAS_EXAMPLE else []
FAST = [*DATASET, "train.epochs=1", "run.figures=false", "run.name=guarded", "train.device=cpu"]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Content, mode and mtime of every file below ``folder``, except the hash cache."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != rawdata.CACHE_NAME:
            st = path.stat()
            found[path.relative_to(folder).as_posix()] = (
                path.read_bytes(),
                stat.S_IMODE(st.st_mode),
                st.st_mtime_ns,
            )
    return found


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch project: this project's configs and the example file (or a stand-in), frozen."""
    for name in list(os.environ):  # not inside a job or a launcher, whatever runs pytest
        if name.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_")):
            monkeypatch.delenv(name)
    for name in ("DATA_DIR", "RUNS_DIR", "RUN_NAME", "LOCAL_TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    if HAS_EXAMPLE:
        shutil.copyfile(EXAMPLE, raw / EXAMPLE.name)
    else:
        (raw / "table.csv").write_text("x,y\n1,0\n", encoding="utf-8")
    assert cli.main(["data", "freeze"]) == 0
    return tmp_path


def tamper(raw: Path) -> str:
    """Append one byte to the first raw file; return its path as reported."""
    path = next(iter(sorted(raw.iterdir())))
    path.chmod(0o644)
    with path.open("ab") as handle:
        handle.write(b"\n")
    path.chmod(0o444)
    return f"data/raw/{path.name}"


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_tampered_raw_data_stops_the_command_before_it_writes(
    project: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    if HAS_EXAMPLE and command == "train":
        assert cli.main(["prepare", *DATASET]) == 0  # so only the raw check can stop training
    changed = tamper(project / "data" / "raw")
    capsys.readouterr()
    before = snapshot(project)
    assert cli.main([command, *FAST]) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert err.startswith("error: raw data in data/raw does not match data/raw.manifest.tsv: ")
    assert f"modified {changed}" in err
    assert snapshot(project) == before


def test_switched_off_verification_is_not_consulted(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(rawdata, "verify_raw", lambda raw_dir, manifest: calls.append(raw_dir))
    cli.main(["prepare", *DATASET, "data.verify_raw=false"])
    assert calls == []
    cli.main(["prepare", *DATASET])
    assert calls == [(project / "data" / "raw").resolve()]


@pytest.mark.skipif(not HAS_EXAMPLE, reason="project generated without the example data")
def test_example_pipeline_leaves_every_raw_byte_mode_and_mtime(project: Path) -> None:
    raw = project / "data" / "raw"
    os.utime(raw / "digits.csv.gz", ns=(0, 10**18))  # a distinctive mtime, easy to spot
    before = snapshot(raw)
    assert cli.main(["prepare", *DATASET]) == 0
    assert cli.main(["train", *FAST]) == 0
    assert cli.main(["evaluate", "--run", "guarded", "--device", "cpu"]) == 0
    assert snapshot(raw) == before
    assert cli.main(["data", "verify", "--full"]) == 0
