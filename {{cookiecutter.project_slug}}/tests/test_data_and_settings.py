"""Data preparation, node-local staging and the `.env` file."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import DIGITS, PACKAGE, cli_env, pkg

config = pkg("config")
data = pkg("data.processed")


def test_prepare_splits_the_digits_reproducibly(digits_project: Path) -> None:
    raw = digits_project / "data" / "raw" / DIGITS.name
    before = raw.stat().st_mtime_ns
    cfg = pkg("task").load_config(None, ["data.verify_raw=false", "task.name=digits"])
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    first = task.datasets(task.processed_dir)
    sizes = [len(first.get(split)) for split in ("train", "val", "test")]
    assert sizes == [1437, 180, 180]
    x, y = first.train.tensors
    assert x.shape[1:] == (1, 8, 8)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert set(y.tolist()) == set(range(10))
    data.prepare(task)
    again = task.datasets(task.processed_dir)
    assert torch.equal(first.test.tensors[0], again.test.tensors[0])
    assert raw.stat().st_mtime_ns == before  # raw data is only read


class Writes:
    """A task whose `prepare` writes given files, then fails when told to."""

    def __init__(self, folder: Path, files: dict[str, bytes], fail: bool = False) -> None:
        self.processed_dir, self.files, self.fail = folder, files, fail

    def prepare(self, out_dir: Path) -> str:
        for name, content in self.files.items():
            (out_dir / name).write_bytes(content)
        if self.fail:
            raise pkg("errors").DataError("reader failed half-way")
        return "done"


def test_prepare_is_all_or_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "processed" / "task"
    assert data.prepare(Writes(folder, {"a.bin": b"1", "b.bin": b"2"})) == "done"
    assert data.read_digests(folder).keys() == {"a.bin", "b.bin"}
    with pytest.raises(pkg("errors").DataError, match="half-way"):
        data.prepare(Writes(folder, {"a.bin": b"new"}, fail=True))
    assert (folder / "a.bin").read_bytes() == b"1"  # the previous result is intact
    assert sorted(p.name for p in folder.parent.iterdir()) == ["task"]  # no temporary left


def test_prepare_replaces_only_what_prepare_made(tmp_path: Path) -> None:
    folder = tmp_path / "processed" / "task"
    folder.mkdir(parents=True)
    (folder / "mine.txt").write_text("my own notes")
    with pytest.raises(pkg("errors").DataError, match=r"exists and prepare did not make it"):
        data.prepare(Writes(folder, {"a.bin": b"1"}))
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]  # untouched
    (folder / "mine.txt").unlink()  # empty, as snakemake leaves an output's folder: taken
    assert data.prepare(Writes(folder, {"a.bin": b"1"})) == "done"
    assert data.prepare(Writes(folder, {"a.bin": b"2"})) == "done"  # its own: replaced
    assert (folder / "a.bin").read_bytes() == b"2"


def test_staging_copies_once_and_refuses_changed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "processed" / "set"
    data.prepare(Writes(source, {"x.bin": b"x" * 1000}))
    cfg = pkg("task").load_config(None, [])
    monkeypatch.delenv(cfg.data.node_tmp_var, raising=False)
    assert data.stage(source, cfg, local_rank=0) == source  # not in a job: read in place
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv(cfg.data.node_tmp_var, str(node))
    staged = data.stage(source, cfg, local_rank=0)
    assert staged == node / "processed" / "set"
    assert (staged / "x.bin").read_bytes() == b"x" * 1000
    mtime = (staged / "x.bin").stat().st_mtime_ns
    assert data.stage(source, cfg, local_rank=0) == staged
    assert (staged / "x.bin").stat().st_mtime_ns == mtime  # up to date: not copied again
    data.prepare(Writes(source, {"x.bin": b"y" * 1000}))  # prepared again: same size
    assert (data.stage(source, cfg, local_rank=0) / "x.bin").read_bytes() == b"y" * 1000
    # Replaced by hand after prepare, same size and time: the copy is checked, never served.
    stat = (source / "x.bin").stat()
    (source / "x.bin").write_bytes(b"z" * 1000)
    os.utime(source / "x.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (staged / "x.bin").write_bytes(b"z" * 1000)
    with pytest.raises(pkg("errors").DataError, match="changed after prepare"):
        data.stage(source, cfg, local_rank=0)
    off = pkg("task").load_config(None, ["data.stage_to_node_tmp=false"])
    with pytest.raises(pkg("errors").DataError, match="changed after prepare"):
        data.stage(source, off, local_rank=0)  # read in place: checked all the same
    data.prepare(Writes(source, {"x.bin": b"x" * 1000}))
    assert data.stage(source, off, local_rank=0) == source


def test_staging_trusts_its_own_verified_copy_within_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "processed" / "set"
    data.prepare(Writes(source, {f"{i}.bin": bytes([i]) * 1000 for i in range(20)}))
    cfg = pkg("task").load_config(None, [])
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv(cfg.data.node_tmp_var, str(node))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    hashed: list[Path] = []
    real_digest = data.file_digest
    monkeypatch.setattr(data, "file_digest", lambda path: hashed.append(path) or real_digest(path))
    staged = data.stage(source, cfg, local_rank=0)
    assert sorted(p.name for p in staged.iterdir() if p.suffix == ".bin") == sorted(
        f"{i}.bin" for i in range(20)
    )
    assert data.stage(source, cfg, local_rank=0) == staged  # the next segment of job 41
    assert hashed == []  # hashed while copying; trusted by size and time afterwards
    os.utime(staged / "3.bin", ns=(0, 0))  # touched since: checked again, in full
    assert data.stage(source, cfg, local_rank=0) == staged
    assert len(hashed) == 20
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # another job on this node checks the copy
    hashed.clear()
    data.stage(source, cfg, local_rank=0)
    assert len(hashed) == 20


def test_staging_fails_with_one_line_when_the_node_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "processed" / "set"
    data.prepare(Writes(source, {"x.bin": b"x" * 1000}))
    cfg = pkg("task").load_config(None, [])
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv(cfg.data.node_tmp_var, str(node))
    usage = shutil.disk_usage(node)
    monkeypatch.setattr(data.shutil, "disk_usage", lambda _p: usage._replace(free=10**6))
    with pytest.raises(pkg("errors").DataError) as full:
        data.stage(source, cfg, local_rank=0)
    assert len(str(full.value).splitlines()) == 1
    message = str(full.value)
    assert "only 0.00 GB free there; free space or set data.stage_to_node_tmp=false" in message
    monkeypatch.undo()  # space is checked first; a disk that fills up while copying:
    monkeypatch.setenv(cfg.data.node_tmp_var, str(node))

    def no_space(_source: Path, target: Path) -> str:
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(data, "_copy_hashed", no_space)
    with pytest.raises(pkg("errors").DataError, match=r"x\.bin: no space left on \$") as err:
        data.stage(source, cfg, local_rank=0)
    assert len(str(err.value).splitlines()) == 1
    assert not list((node / "processed").iterdir())  # nothing half-written left


def test_dotenv_sets_paths_but_real_variables_win(project: Path) -> None:
    (project / ".env").write_text("RUNS_DIR=elsewhere/runs\nDATA_DIR=/abs/data\n")
    code = (
        f"from {PACKAGE}.settings import get_settings; s = get_settings(); "
        "print(s.runs_dir); print(s.data_dir)"
    )

    def paths(extra: dict[str, str]) -> list[str]:
        env = cli_env(project, extra)
        for var in ("RUNS_DIR", "DATA_DIR"):
            if var not in extra:
                env.pop(var, None)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return out.stdout.split()

    assert paths({}) == [str(project / "elsewhere" / "runs"), "/abs/data"]
    assert paths({"RUNS_DIR": "/from/env"})[0] == "/from/env"


def test_library_caches_default_below_data_dir_and_set_values_win(project: Path) -> None:
    (project / ".env").write_text("DATA_DIR=store\nHF_DATASETS_CACHE=/from/dotenv/datasets\n")
    names = pkg("settings").CACHE_VARS
    code = (
        f"import os, torch; from {PACKAGE}.settings import get_settings; get_settings(); "
        f"print(*(os.environ[name] for name in {names!r}), torch.hub.get_dir())"
    )

    def caches(extra: dict[str, str]) -> dict[str, str]:
        env = cli_env(project, extra)
        for var in (*names, "DATA_DIR", "XDG_CACHE_HOME"):
            if var not in extra:
                env.pop(var, None)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return dict(zip((*names, "torch.hub"), out.stdout.split(), strict=True))

    cache = project / "store" / ".cache"  # unset: below DATA_DIR; a .env entry wins
    assert caches({}) == {
        "HF_HOME": str(cache / "huggingface"),
        "HF_HUB_CACHE": str(cache / "huggingface" / "hub"),
        "HF_DATASETS_CACHE": "/from/dotenv/datasets",
        "TORCH_HOME": str(cache / "torch"),
        "torch.hub": str(cache / "torch" / "hub"),  # what torch itself then uses
    }
    # A real variable wins over .env and the default; relative is from the project root.
    got = caches({"HF_HOME": "/env/hf", "HF_DATASETS_CACHE": "/env/ds", "TORCH_HOME": "models"})
    assert got["HF_HOME"] == "/env/hf"
    assert got["HF_HUB_CACHE"] == "/env/hf/hub"  # follows the HF_HOME in effect
    assert got["HF_DATASETS_CACHE"] == "/env/ds"
    assert got["TORCH_HOME"] == str(project / "models")
    assert got["torch.hub"] == str(project / "models" / "hub")


def test_library_caches_name_the_libraries_own_default_when_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = pkg("settings")
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in (*settings.CACHE_VARS, "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    caches = settings.library_caches()
    assert caches["HF_HOME"] == tmp_path / ".cache" / "huggingface"
    assert caches["HF_DATASETS_CACHE"] == tmp_path / ".cache" / "huggingface" / "datasets"
    assert caches["TORCH_HOME"] == tmp_path / ".cache" / "torch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.library_caches()["TORCH_HOME"] == tmp_path / "xdg" / "torch"
