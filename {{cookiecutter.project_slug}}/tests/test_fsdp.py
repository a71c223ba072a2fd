"""dist.strategy = fsdp with two CPU processes (gloo): the loss of ddp, sharded checkpoints that
resume bit-exactly (also from background saves and on one process), slow and killed saves."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file

from conftest import pkg
from test_ddp import free_job_id, srun_like, train_losses

# Every test here starts two or more processes: `make test-all` and CI run them.
pytestmark = pytest.mark.slow

checkpoint = pkg("engine.state.checkpoint")
TOWER = [
    "task.name=toy_tasks.tower",
    "model.depth=3",
    "train.epochs=2",  # 14 steps per epoch with 2 x 16 samples per step
    # 97 validation samples: rank 0 scores 49 (4 batches of 16), rank 1 48 (3 batches); a
    # sharded forward needs every rank, so rank 1 must run a 4th, unscored one.
    "task.n=646",
    "run.log_every_steps=1",
    "run.best_metric=loss",
]


def finish(procs: list[subprocess.Popen[str]], codes: tuple[int, int] = (0, 0)) -> str:
    """Wait for both ranks; rank 0's output (rank 1 stays silent)."""
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert tuple(p.returncode for p in procs) == codes, "".join(outs)
    return outs[0]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.load_latest(run_dir / "checkpoints")
    assert state is not None
    return state["model"]


def test_fsdp_follows_ddp_and_resumes_bit_exactly(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = project / "runs"
    both = [
        srun_like(project, free_job_id(), *TOWER, "run.name=d"),
        srun_like(project, free_job_id(), *TOWER, "run.name=f", "dist.strategy=fsdp"),
    ]
    for procs in both:
        finish(procs)
    # Sharded gradients are reduced in another order than DDP's all-reduce: equal up to
    # rounding, which stays far below 1e-4 relative over these 28 steps.
    ddp, fsdp = train_losses(runs / "d"), train_losses(runs / "f")
    assert len(fsdp) == 28
    assert fsdp == pytest.approx(ddp, rel=1e-4)
    # best.pt holds whole tensors, gathered from the shards: it loads into an unsharded model.
    best = torch.load(runs / "f" / "best.pt", weights_only=True)["model"]
    final = weights(runs / "f")
    assert {k: v.shape for k, v in best.items()} == {k: v.shape for k, v in final.items()}

    # The same fsdp run in segments: background saves every 3 steps, a synchronous one at
    # each segment's end. The step-8 checkpoint is dropped as if the job had been killed
    # before it, so the second segment resumes from the newest background save: step 6's,
    # unless step 3's was still being written then (a loaded machine), which skips step 6
    # and says so.
    fsdp_args = [*TOWER, "run.name=s", "dist.strategy=fsdp"]
    background = ["run.async_checkpoint=true", "run.checkpoint_every_steps=3"]
    out = finish(
        srun_like(project, free_job_id(), *fsdp_args, *background, "run.max_steps_this_segment=8")
    )
    saved = [3, 8] if "the checkpoint due at step 6 is skipped" in out else [3, 6, 8]
    assert [s for s, _ in checkpoint.list_checkpoints(runs / "s" / "checkpoints")] == saved, out
    checkpoint.remove(runs / "s" / "checkpoints" / "step-000000008.dcp")
    out = finish(srun_like(project, free_job_id(), *fsdp_args, "run.max_steps_this_segment=5"))
    assert f"resumed from step {saved[-2]}" in out
    out = finish(srun_like(project, free_job_id(), *fsdp_args))
    assert f"resumed from step {saved[-2] + 5}" in out
    final = weights(runs / "s")
    assert final.keys() == weights(runs / "f").keys()
    for key, value in weights(runs / "f").items():
        assert torch.equal(final[key], value), key

    # A flipped byte in one rank's shard: found, named, and the previous checkpoint is used.
    newest = checkpoint.list_checkpoints(runs / "f" / "checkpoints")[-1][1]
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert checkpoint.load_latest(runs / "f" / "checkpoints")["position"]["step"] < 28
    assert f"{shard}: checksum mismatch" in capsys.readouterr().err

    # The two-process checkpoint resumes in one process: resharded, and said so.
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    cfg = load(
        None,
        [
            *fsdp_args[:2],
            "task.n=646",
            "run.name=s",
            "dist.strategy=fsdp",
            "train.epochs=3",
            "train.batch_size=32",
            "data.verify_raw=false",
            "run.figures=false",
            "model.hidden=32",
            "model.dropout=0.0",
        ],
    )
    assert train(cfg).exit_code == 0
    assert "written by 2 process(es), resharded to 1" in capsys.readouterr().out
    # 2 epochs of 14 steps, then the third in one process: 14 steps of 32.
    assert checkpoint.load_latest(runs / "s" / "checkpoints")["position"]["step"] == 42


SLOW_SAVE = """
import os, time
if os.environ.get("SLURM_PROCID") == "0":
    from {package}.engine.state import checkpoint
    write, slow = checkpoint.write_manifest, set()
    def write_manifest(path, *args):
        if path not in slow:  # once per checkpoint: a disk far slower than the timeout
            slow.add(path)
            time.sleep(float(os.environ["SLOW_SAVE_S"]))
        return write(path, *args)
    checkpoint.write_manifest = write_manifest
"""


def test_a_slow_save_ends_in_a_checkpoint_and_a_kill_during_one_keeps_the_last(
    project: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fault injection without a hook in the package: a sitecustomize module on the children's
    # path makes rank 0's manifest write (part of every save) take longer than the timeout.
    hook = tmp_path_factory.mktemp("slow")
    package = checkpoint.__package__.partition(".")[0]
    (hook / "sitecustomize.py").write_text(SLOW_SAVE.format(package=package))
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("SLOW_SAVE_S", "15")
    ckpt_dir = project / "runs" / "slow" / "checkpoints"
    procs = srun_like(
        project,
        free_job_id(),
        *TOWER,
        "run.name=slow",
        "dist.strategy=fsdp",
        "dist.timeout_minutes=0.2",  # 12 s: shorter than the save
        "run.checkpoint_every_steps=4",
        "train.epochs=100",
    )
    try:
        deadline = time.monotonic() + 240
        while not (ckpt_dir / ".step-000000008.dcp.tmp").exists():  # the second save began
            assert all(p.poll() is None for p in procs), finish(procs)
            assert time.monotonic() < deadline, "no second save"
            time.sleep(0.1)
        assert [s for s, _ in checkpoint.list_checkpoints(ckpt_dir)] == [4]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)  # during the second (slow) save
            p.communicate(timeout=60)
    state = checkpoint.load_latest(ckpt_dir)  # verified against its manifest
    assert state["position"]["step"] == 4


def test_damaged_foreign_and_unreadable_checkpoints(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    errors = pkg("errors")
    args = [
        "task.name=toy_tasks.blobs",
        "data.verify_raw=false",
        "run.figures=false",
        "model.hidden=16",
        "train.batch_size=32",
        "run.checkpoint_every_steps=2",
        "run.max_steps_this_segment=6",
    ]
    train(load(None, [*args, "run.name=t"]))
    ckpt_dir = project / "runs" / "t" / "checkpoints"
    found = [p for _, p in checkpoint.list_checkpoints(ckpt_dir)]
    assert len(found) == 3
    data = bytearray(found[-1].read_bytes())
    data[len(data) // 2] ^= 0x10
    found[-1].write_bytes(bytes(data))
    capsys.readouterr()
    train(load(None, [*args, "run.name=t"]))
    out = capsys.readouterr().out
    assert f"warning: skipping a checkpoint: {found[-1]}: checksum mismatch" in out
    assert "resumed from step 4" in out

    # Another run's checkpoint in this run's folder is refused, not resumed.
    train(load(None, [*args, "run.name=u"]))
    other = project / "runs" / "u" / "checkpoints"
    for _, path in checkpoint.list_checkpoints(ckpt_dir)[-1:]:
        for file in (path, checkpoint.manifest_path(path)):
            (other / file.name.replace("step-0", "step-1")).write_bytes(file.read_bytes())
    with pytest.raises(errors.CheckpointError, match="belongs to another run"):
        train(load(None, [*args, "run.name=u"]))

    # Every checkpoint damaged: a distinct exit code, not a fresh start.
    for _, path in checkpoint.list_checkpoints(ckpt_dir):
        path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(errors.NoIntactCheckpointError) as caught:
        train(load(None, [*args, "run.name=t"]))
    assert caught.value.exit_code == 5


def test_a_frozen_part_without_init_from_is_kept_in_checkpoints(project: Path) -> None:
    """Frozen weights the task built itself (a teacher, a seeded base): nothing else has them.

    A frozen base read from `model.init_from` is left out instead (the test below).
    """
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    args = [
        "task.name=toy_tasks.tower",
        "task.adapter_rank=2",
        "data.verify_raw=false",
        "run.figures=false",
        "model.hidden=64",
        "model.depth=2",
        "train.batch_size=32",
        "run.max_steps_this_segment=2",
        "run.name=lora",
    ]
    train(load(None, args))
    [(_, path)] = checkpoint.list_checkpoints(project / "runs" / "lora" / "checkpoints")
    state = checkpoint.load(path)
    model = pkg("task").load_task(load(None, args), pkg("settings").get_settings()).build_model()
    assert any(not p.requires_grad for p in model.parameters())
    assert state["model"].keys() == model.state_dict().keys()
    assert state["frozen"] is None
    # Held once: the optimizer's state has the trainable parameters only.
    assert len(state["optimizer"]["state"]) == sum(p.requires_grad for p in model.parameters())
    assert (
        train(load(None, [*args, "run.max_steps_this_segment=0", "train.epochs=1"])).exit_code == 0
    )


def test_a_frozen_base_from_init_from_is_left_out_and_checked_by_digest(project: Path) -> None:
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    args = [
        "task.name=toy_tasks.tower",
        "task.adapter_rank=2",
        "data.verify_raw=false",
        "run.figures=false",
        "model.hidden=64",
        "model.depth=2",
        "train.batch_size=32",
        "run.max_steps_this_segment=2",
        "run.name=lora",
        "model.init_from=base.safetensors",
    ]
    task = pkg("task").load_task(load(None, args[:-1]), pkg("settings").get_settings())
    base = task.build_model().state_dict()
    save_file(base, project / "base.safetensors")
    train(load(None, args))
    [(_, path)] = checkpoint.list_checkpoints(project / "runs" / "lora" / "checkpoints")
    state = checkpoint.load(path)
    frozen = sorted(state["frozen"]["keys"])
    assert frozen and not set(frozen) & state["model"].keys()
    assert set(frozen) | state["model"].keys() == base.keys()
    # Other weights in the same file: refused by the digest.
    changed = {k: v + 1 if k in frozen else v for k, v in base.items()}
    save_file(changed, project / "base.safetensors")
    with pytest.raises(pkg("errors").CheckpointError, match="frozen parameters"):
        train(load(None, [*args, "train.epochs=2"]))


def _memory_kib(field: str) -> int:
    """A memory figure of this process from /proc (VmRSS: now, VmHWM: peak), in KiB."""
    status = Path("/proc/self/status").read_text(encoding="utf-8")
    found = re.search(rf"{field}:\s+(\d+) kB", status)
    assert found is not None, status
    return int(found[1])


def _state_bytes(rank: int, strategy: str, port: int, out: Path) -> None:
    """One rank: build the tower with `strategy`, take a step; write its local state bytes,
    the memory its build and sharding added at their peak and the devices it was built on."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    distributed = pkg("engine.parallel.distributed")
    denv = distributed.DistEnv(rank=rank, world_size=2, local_world_size=2, launcher="torchrun")
    distributed.init(denv, torch.device("cpu"), "gloo", 1.0)

    def build(width: int, depth: int) -> tuple[torch.nn.Module, torch.nn.Module, set[str]]:
        """`setup` of a `width` x `depth` tower; the devices `build_model` put it on."""
        cfg = pkg("task").load_config(
            None,
            [
                "task.name=toy_tasks.tower",
                f"model.hidden={width}",
                f"model.depth={depth}",
                f"dist.strategy={strategy}",
            ],
        )
        task = pkg("task").load_task(cfg, pkg("settings").get_settings())
        built, devices = task.build_model, set()

        def watched() -> torch.nn.Module:
            model = built()
            devices.update(t.device.type for t in model.state_dict().values())
            return model

        task.build_model = watched
        net, model = (
            pkg("engine.parallel.strategy").create(cfg, denv, torch.device("cpu")).setup(task)
        )
        return net, model, devices

    # A tiny tower first pays the one-off costs of a first build (lazy imports, buffers of
    # the collectives), so that the peak measured below is the model's own.
    build(8, 1)
    Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")  # peak := now (Linux)
    before = _memory_kib("VmRSS")
    net, model, devices = build(512, 32)
    peak = (_memory_kib("VmHWM") - before) * 1024
    optimizer = torch.optim.AdamW(net.parameters())
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(local(p) for p in net.parameters())
    moments = sum(local(v) for s in optimizer.state.values() for v in s.values() if v.dim())
    found = {"state": params + moments, "built": peak, "devices": sorted(devices)}
    (out / f"{strategy}-{rank}.json").write_text(json.dumps(found))
    distributed.shutdown()


def test_fsdp_holds_half_the_state_per_rank_and_only_rank_0_builds_the_whole_model(
    tmp_path: Path,
) -> None:
    # An 8.4M-parameter tower of 32 blocks (34 MB of weights, 100 MB with Adam moments per
    # ddp rank, 1 MB its largest tensor): enough to see the ratios, small enough for CI.
    for strategy in ("ddp", "fsdp"):
        port = pkg("engine.parallel.distributed").rendezvous_port(free_job_id(), 0)
        mp.spawn(_state_bytes, args=(strategy, port, tmp_path), nprocs=2)
    ddp, fsdp = (
        [json.loads((tmp_path / f"{s}-{r}.json").read_text()) for r in range(2)]
        for s in ("ddp", "fsdp")
    )
    assert ddp[0]["state"] == ddp[1]["state"]  # replicated
    assert 0.49 < max(r["state"] for r in fsdp) / ddp[0]["state"] < 0.52  # a half (+ padding)
    # Under fsdp rank 1 builds on the meta device and then holds only its shards (and one
    # whole tensor at a time on its way from rank 0); ddp builds the whole model everywhere.
    weights = ddp[0]["state"] / 3  # fp32 weights and two moments of the same size
    assert [r["devices"] for r in ddp] == [["cpu"], ["cpu"]]
    assert [r["devices"] for r in fsdp] == [["cpu"], ["meta"]]
    assert ddp[1]["built"] > weights
    assert fsdp[0]["built"] > weights  # rank 0 builds it, as always
    assert fsdp[1]["built"] < 0.8 * weights, (fsdp, weights)  # about 0.65: a half + slack


class TiedLM(torch.nn.Module):
    """The output layer tied to the embedding, two blocks, a persistent and a non-persistent
    buffer: what a meta build must get right besides plain weights."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))
        self.out = torch.nn.Linear(16, 64, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.rand(16), persistent=False)
        self.register_buffer("steps", torch.tensor(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class TiedTask:
    """The part of the task seam `Strategy.setup` uses."""

    name = "tied"
    build_model = TiedLM

    def blocks(self, model: TiedLM) -> list[torch.nn.Module]:
        return list(model.blocks)


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


SMALL_TOWER = ["task.name=toy_tasks.tower", "model.hidden=32", "model.depth=2"]


def _sharded_checks(rank: int, port: int, out: Path) -> None:
    """One of two ranks: a tied model built on the meta device, accumulation under ddp and
    fsdp, `model.init_from` into the sharded model; each rank saves what it found."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    distributed, strategy = pkg("engine.parallel.distributed"), pkg("engine.parallel.strategy")
    denv = distributed.DistEnv(rank=rank, world_size=2, local_world_size=2, launcher="torchrun")
    distributed.init(denv, torch.device("cpu"), "gloo", 1.0)
    cpu, found = torch.device("cpu"), {}

    fsdp = pkg("task").load_config(None, ["dist.strategy=fsdp"])
    torch.manual_seed(0)
    net, model = strategy.create(fsdp, denv, cpu).setup(TiedTask())
    torch.manual_seed(0)
    reference, tokens = TiedLM(), torch.arange(12).view(3, 4)
    found["tied"] = net.out.weight is net.embed.weight
    found["same"] = all(
        torch.equal(_whole(v), reference.state_dict()[k]) for k, v in net.state_dict().items()
    )
    found["buffer"] = torch.equal(net.scale, reference.scale)
    found["output"] = torch.equal(model(tokens).detach(), reference(tokens).detach())

    # Two micro-batches per step, as the trainer runs them: the first without gradient sync.
    for name in ("ddp", "fsdp"):
        cfg = pkg("task").load_config(
            None,
            [*SMALL_TOWER, f"dist.strategy={name}"],
        )
        task = pkg("task").load_task(cfg, pkg("settings").get_settings())
        torch.manual_seed(0)
        plan = strategy.create(cfg, denv, cpu)
        net, model = plan.setup(task)
        micro = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(rank))
        with plan.sync(False):
            (model(micro[0]).square().mean() / 2).backward()
        found[f"{name}-inner"] = [p.grad is not None for p in net.parameters()]
        with plan.sync(True):
            (model(micro[1]).square().mean() / 2).backward()
        found[f"{name}-grads"] = {n: _whole(p.grad) for n, p in net.named_parameters()}

    # model.init_from into the sharded tower, as the trainer loads it: each rank its slices.
    weights = pkg("data.pretrained").read_weights(out / "tower.safetensors")
    pkg("engine.state.checkpoint").load_model(
        task.pretrained_target(net), weights, "model.init_from"
    )
    found["init"] = {k: _whole(v) for k, v in net.state_dict().items()}
    torch.save(found, out / f"found-{rank}.pt")
    distributed.shutdown()


def test_meta_build_accumulation_and_init_from_under_fsdp(tmp_path: Path) -> None:
    cfg = pkg("task").load_config(None, [*SMALL_TOWER, "dist.strategy=fsdp"])
    torch.manual_seed(7)  # other weights than the runs' seed 0 builds
    tower = pkg("task").load_task(cfg, pkg("settings").get_settings()).build_model()
    pretrained = tower.state_dict()
    save_file(pretrained, tmp_path / "tower.safetensors")
    port = pkg("engine.parallel.distributed").rendezvous_port(free_job_id(), 0)
    mp.spawn(_sharded_checks, args=(port, tmp_path), nprocs=2)
    for rank in range(2):
        found = torch.load(tmp_path / f"found-{rank}.pt", weights_only=True)
        # Rank 1 built only the shapes; rank 0's values reached it, tied weights and buffers
        # (also one left out of state dicts) too.
        assert [found[k] for k in ("tied", "same", "buffer", "output")] == [True] * 4, rank
        # fsdp leaves the inner micro-batch's gradients unreduced (no sharded gradient yet);
        # ddp keeps each rank's own. The step's gradients agree up to rounding.
        assert not any(found["fsdp-inner"]) and all(found["ddp-inner"])
        ddp, fsdp = found["ddp-grads"], found["fsdp-grads"]
        assert ddp.keys() == fsdp.keys()
        for key, grad in ddp.items():
            assert grad.abs().sum() > 0
            torch.testing.assert_close(fsdp[key], grad, rtol=1e-5, atol=1e-7)
        assert found["init"].keys() == pretrained.keys()
        for key, value in pretrained.items():
            assert torch.equal(found["init"][key], value), key


def test_strategy_settings(project: Path) -> None:
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    config_error = pkg("errors").ConfigError
    with pytest.raises(config_error, match=r"dist.strategy: must be one of \['ddp', 'fsdp'\]"):
        load(None, ["dist.strategy=zero"])
    args = ["data.verify_raw=false", "run.figures=false", "model.hidden=32", "train.epochs=1"]
    # Without blocks there is nothing to recompute: one line instead of a silent no-op.
    with pytest.raises(config_error, match=r"train.activation_checkpointing: task .* names no"):
        train(
            load(
                None, ["task.name=toy_tasks.blobs", "train.activation_checkpointing=blocks", *args]
            )
        )
    # Recomputed blocks: each block's inner layer runs again in backward, same gradients.
    grads, calls = {}, {}
    for mode in ("none", "blocks"):
        cfg = load(None, ["task.name=toy_tasks.tower", f"train.activation_checkpointing={mode}"])
        task = pkg("task").load_task(cfg, pkg("settings").get_settings())
        plan = pkg("engine.parallel.strategy").create(
            cfg, pkg("engine.parallel.distributed").DistEnv(), torch.device("cpu")
        )
        torch.manual_seed(0)
        net, model = plan.setup(task)
        runs: list[int] = []
        net.blocks[0].linear.register_forward_hook(lambda *_, runs=runs: runs.append(1))
        model(torch.randn(8, 16)).sum().backward()
        grads[mode], calls[mode] = [p.grad for p in net.parameters()], len(runs)
    assert calls == {"none": 1, "blocks": 2}
    for plain, recomputed in zip(grads["none"], grads["blocks"], strict=True):
        assert torch.equal(plain, recomputed)


def test_a_model_that_placed_itself_is_not_moved() -> None:
    place = pkg("engine.parallel.strategy").place
    built_on_cpu = torch.nn.Linear(2, 2)
    assert place(built_on_cpu, torch.device("meta")).weight.device.type == "meta"
    # A part already elsewhere (e.g. a quantised base its library put on the GPU): left alone.
    placed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    assert place(placed, torch.device("meta"))[0].weight.device.type == "cpu"
