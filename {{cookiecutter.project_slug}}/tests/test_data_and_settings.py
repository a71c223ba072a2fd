"""Data preparation, node-local staging and the `.env` file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import DIGITS, PACKAGE, cli_env, pkg

config = pkg("config")
data = pkg("data")


def test_prepare_splits_the_digits_reproducibly(digits_project: Path) -> None:
    raw = digits_project / "data" / "raw" / DIGITS.name
    before = raw.stat().st_mtime_ns
    path = digits_project / "data" / "processed" / "digits.pt"
    first = data.load_splits(path)
    assert (len(first.train), len(first.val), len(first.test)) == (1437, 180, 180)
    assert first.input_shape == (1, 8, 8)
    assert first.train.x.min() >= 0.0 and first.train.x.max() <= 1.0
    assert set(first.train.y.tolist()) == set(range(10))
    cfg = config.load_config(None, ["data.verify_raw=false"])
    data.prepare(cfg, pkg("settings").get_settings())
    again = data.load_splits(path)
    assert torch.equal(first.test.x, again.test.x)
    assert raw.stat().st_mtime_ns == before  # raw data is only read


def test_staging_copies_once_to_the_node_local_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "processed" / "set.pt"
    source.parent.mkdir()
    source.write_bytes(b"x" * 1000)
    cfg = config.load_config(None, [])
    monkeypatch.delenv(cfg.data.node_tmp_var, raising=False)
    assert data.stage(source, cfg, local_rank=0) == source  # not in a job: read in place
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv(cfg.data.node_tmp_var, str(node))
    staged = data.stage(source, cfg, local_rank=0)
    assert staged == node / "processed" / "set.pt"
    assert staged.read_bytes() == source.read_bytes()
    mtime = staged.stat().st_mtime_ns
    assert data.stage(source, cfg, local_rank=0) == staged
    assert staged.stat().st_mtime_ns == mtime  # up to date: not copied again
    source.write_bytes(b"y" * 1000)  # prepared again: same size, new content and time
    os.utime(source, ns=(mtime + 10**9, mtime + 10**9))
    assert data.stage(source, cfg, local_rank=0).read_bytes() == b"y" * 1000
    off = config.load_config(None, ["data.stage_to_node_tmp=false"])
    assert data.stage(source, off, local_rank=0) == source


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
