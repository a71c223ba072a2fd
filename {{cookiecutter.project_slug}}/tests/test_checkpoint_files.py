"""Checkpoint files at disk speed: digests taken as written, checked as read; a snapshot."""

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import pkg

checkpoint = pkg("engine.checkpoint")
checkpoint_io = pkg("engine.checkpoint_io")
distributed = pkg("engine.distributed")
errors = pkg("errors")
strategies = pkg("engine.strategy")


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


def test_a_shard_changed_after_the_save_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, net, stepped, _ = saver(tmp_path, "fsdp")
    out.save(1, net, stepped, {"step": 1}, background=False)
    ((_, path),) = checkpoint.list_checkpoints(tmp_path / "ckpt")
    shard = max(path.glob("__0_*"), key=lambda f: f.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(errors.NoIntactCheckpointError):
        out.load_latest(net, stepped)
    out.close()
    assert f"skipping a checkpoint: {shard}: checksum mismatch" in capsys.readouterr().out


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
