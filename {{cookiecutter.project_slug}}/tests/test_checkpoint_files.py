"""Checkpoint files at disk speed: digests taken as written, checked as read; a snapshot."""

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.planner import LoadPlan

from conftest import pkg

checkpoint = pkg("engine.state.checkpoint")
checkpoint_io = pkg("engine.state.checkpoint_io")
distributed = pkg("engine.parallel.distributed")
errors = pkg("errors")
shard_files = pkg("engine.state.shard_files")
strategies = pkg("engine.parallel.strategy")


def saver(tmp_path: Path, strategy: str) -> tuple[object, nn.Module, object, object]:
    """A one-process checkpointer of `strategy` for a small model with momentum."""
    cfg = pkg("task").load_config(None, [f"dist.strategy={strategy}"])
    denv = distributed.DistEnv()
    plan = strategies.create(cfg, denv, torch.device("cpu"))
    net = nn.ParameterList(nn.Parameter(torch.randn(n)) for n in (3000, 70, 5))
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for weight in net.parameters():
        weight.grad = torch.randn_like(weight)
    sgd.step()
    stepped = strategies.Optimizers([sgd])
    out = checkpoint_io.Checkpointer(tmp_path / "ckpt", plan, denv, keep=2, say=print)
    out.run_id = "r"
    return out, net, stepped, plan


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_digests_taken_while_writing_are_those_of_the_files(
    tmp_path: Path, strategy: str
) -> None:
    out, net, stepped, _ = saver(tmp_path, strategy)
    out.save(1, net, stepped, {"step": 1}, background=False)
    out.close()
    ((_, path),) = checkpoint.list_checkpoints(tmp_path / "ckpt")
    manifest = checkpoint.read_manifest(path)
    folder = path if path.is_dir() else path.parent
    on_disk = {name: checkpoint.file_digest(folder / name) for name in manifest["files"]}
    assert on_disk == manifest["files"]
    if strategy == "fsdp":  # every file of the folder is listed: shards, DCP's metadata, meta
        listed = {f.name for f in path.iterdir()} - {checkpoint.MANIFEST}
        assert listed == set(manifest["files"]) and {".metadata", "meta.pt"} <= listed


def test_a_background_save_writes_the_state_of_its_step(tmp_path: Path) -> None:
    out, net, stepped, plan = saver(tmp_path, "fsdp")
    saved = [w.detach().clone() for w in net.parameters()]
    out.save(1, net, stepped, {"step": 1}, background=True)
    with torch.no_grad():  # training goes on while the save is written
        for weight in net.parameters():
            weight.add_(1.0)
    out.wait()
    state = out.load_latest(net, stepped)
    plan.load(net, stepped, state, "test")
    out.close()
    assert all(torch.equal(w, s) for w, s in zip(net.parameters(), saved, strict=True))


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("shard", lambda data: flip(data, len(data) // 2)),  # in a tensor's data: read as is
        ("shard", lambda data: flip(data, len(data) - 30)),  # in a zip index: torch.load fails
        ("shard", lambda data: data[: len(data) // 3]),  # cut short
        (".metadata", lambda data: flip(data, len(data) // 2)),
    ],
)
def test_a_shard_changed_after_the_save_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str, damage: Any
) -> None:
    out, net, stepped, _ = saver(tmp_path, "fsdp")
    out.save(1, net, stepped, {"step": 1}, background=False)
    ((_, path),) = checkpoint.list_checkpoints(tmp_path / "ckpt")
    shards = path.glob("__0_*") if file == "shard" else [path / file]
    damaged = max(shards, key=lambda f: f.stat().st_size)
    damaged.write_bytes(damage(damaged.read_bytes()))
    with pytest.raises(errors.NoIntactCheckpointError):
        out.load_latest(net, stepped)
    out.close()
    assert f"skipping a checkpoint: {damaged}: checksum mismatch" in capsys.readouterr().out


def test_each_file_is_checked_by_its_own_process_also_where_it_reads_none_of_it(
    tmp_path: Path,
) -> None:
    """A process checks the files of its rank (modulo the processes), read or not, and leaves
    the others' to them: with 2 processes, rank 1 checks no file that rank 0 wrote."""
    out, net, stepped, _ = saver(tmp_path, "fsdp")
    out.save(1, net, stepped, {"step": 1}, background=False)
    out.close()
    ((_, path),) = checkpoint.list_checkpoints(tmp_path / "ckpt")
    shard = max(path.glob("__0_*"), key=lambda f: f.stat().st_size)
    shard.write_bytes(flip(shard.read_bytes(), 100))
    manifest, nothing = checkpoint.read_manifest(path), LoadPlan([])
    other = shard_files.reader(path, manifest, rank=1, world_size=2)
    other.read_data(nothing, None)
    with other.checked.create_stream(shard, "rb") as f:  # read by rank 1 as it is
        assert f.read() == shard.read_bytes()
    # ... unless reading it failed: then it is named by its checksum, not by the failure.
    with pytest.raises(errors.CheckpointError, match=f"{shard}: checksum mismatch"):
        fail_reading(other.checked, shard)
    with pytest.raises(errors.CheckpointError, match=f"{shard}: checksum mismatch"):
        shard_files.reader(path, manifest, rank=0, world_size=2).read_data(nothing, None)


def fail_reading(files: Any, path: Path) -> None:
    with files.create_stream(path, "rb"):
        raise RuntimeError("torch.load: PytorchStreamReader failed reading zip archive")


def test_a_file_read_in_any_order_is_digested_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP and torch.load read a file out of order, again, or not at all in places."""
    monkeypatch.setattr(shard_files.CheckedFile, "KEEP", 64)  # pieces kept and pieces waiting
    rng = random.Random(0)  # noqa: S311  (read patterns, not secrets)
    data = rng.randbytes(5000)
    intact, changed = tmp_path / "intact", tmp_path / "changed"
    intact.write_bytes(data)
    expected = checkpoint.file_digest(intact)
    for trial in range(300):
        file = intact if trial % 3 else changed
        changed.write_bytes(flip(data, rng.randrange(len(data))))
        with file.open("rb") as f:
            checked = shard_files.CheckedFile(f, expected, checkpoint.DIGEST)
            for _ in range(rng.randrange(12)):
                at, size = rng.randrange(len(data)), rng.randint(1, 600)
                checked.seek(at)
                if rng.random() < 0.5:
                    got = checked.read(size)
                else:
                    buffer = bytearray(size)
                    got = bytes(buffer[: checked.readinto(buffer)])
                assert got == file.read_bytes()[at : at + size]
            problem = checked.check()
        assert (problem is None) == (file == intact), (trial, problem)


def test_the_zip_crc_switch_holds_for_its_own_thread_and_ends_with_it() -> None:
    config = pytest.importorskip("torch.utils.serialization").config
    inside, elsewhere = threading.Event(), []

    def other_thread() -> None:  # a writer thread of its own, opening no file this way
        inside.wait()
        elsewhere.append(config.save.compute_crc32)

    thread = threading.Thread(target=other_thread)
    thread.start()
    with checkpoint.without_zip_crc():
        off_here = not config.save.compute_crc32
        inside.set()
        thread.join()
    assert off_here and elsewhere == [True]  # off for this thread only
    assert config.save.compute_crc32  # and back once it ends
