"""`plan`: the memory and checkpoint arithmetic, the advice that follows, the command."""

from pathlib import Path

import pytest
import torch

from conftest import pkg, run_cli

plan, transformer = pkg("ops.plan"), pkg("blocks.transformer")
GB = 1e9


def causal_lm_params(vocab: int, context: int, width: int, depth: int) -> int:
    """Parameters of transformer.CausalLM, written out: embeddings, blocks, final norm, head."""
    block = 2 * 2 * width + (3 * width * width + 3 * width) + (width * width + width)
    block += (width * 4 * width + 4 * width) + (4 * width * width + width)
    return vocab * width + context * width + depth * block + 2 * width + width * vocab


def test_parameters_are_counted_on_the_meta_device_without_allocating() -> None:
    small = transformer.CausalLM(256, 32, width=16, depth=2, heads=2, dropout=0.0)
    counted = plan.count(small)
    assert counted.params == sum(p.numel() for p in small.parameters())
    assert counted.params == causal_lm_params(256, 32, 16, 2)
    assert counted.block_params == sum(p.numel() for p in small.blocks[0].parameters())
    # 6.4 billion parameters: 26 GB in fp32 if they were allocated.
    with torch.device("meta"):
        big = transformer.CausalLM(256, 2048, width=4096, depth=32, heads=32, dropout=0.0)
        adapted = transformer.LoRA(big, rank=8, alpha=16.0, targets=("qkv", "proj"))
    assert plan.count(big).params == causal_lm_params(256, 2048, 4096, 32)
    lora = plan.count(adapted)
    assert lora.trainable == 32 * 8 * ((4096 + 3 * 4096) + (4096 + 4096))  # a and b, 2 layers
    assert lora.params == lora.trainable + causal_lm_params(256, 2048, 4096, 32)


def test_state_and_checkpoint_arithmetic() -> None:
    full = plan.Model(params=10**9, trainable=10**9, buffer_bytes=0, block_params=10**8)
    assert plan.state_bytes(full, "ddp", 4, 2) == 16e9  # 16 B/param on every GPU
    assert plan.state_bytes(full, "fsdp", 4, 2) == 4e9 + 2 * 2 * 1e8  # a quarter + 2 blocks
    assert plan.checkpoint_bytes(full) == 12e9  # weights and AdamW moments, no gradients
    frozen = plan.Model(params=10**9, trainable=10**6, buffer_bytes=0, block_params=10**8)
    assert plan.state_bytes(frozen, "ddp", 1, 2) == 4e9 + 12e6
    assert plan.checkpoint_bytes(frozen) == 12e6  # the frozen base is left out of checkpoints
    base = torch.nn.Linear(4, 4).to(torch.bfloat16).requires_grad_(False)
    counted = plan.count(torch.nn.Sequential(base, torch.nn.Linear(4, 2)))
    assert (counted.params, counted.trainable, counted.frozen_bytes) == (30, 10, 20 * 2)
    bf16 = plan.Model(10**9, 10**6, 0, 10**8, frozen_bytes=2 * (10**9 - 10**6))  # bf16 base
    assert plan.state_bytes(bf16, "ddp", 1, 2) == 2 * (1e9 - 1e6) + 16e6


@pytest.mark.parametrize(
    ("text", "gb"),
    [("40G or 80G (--constraint=80gb)", 40), ("94G", 94), ("20G (slice)", 20), ("unknown", 0)],
)
def test_gpu_memory_of_a_preset_takes_the_smallest_size(text: str, gb: float) -> None:
    assert plan.gpu_gb(text) == gb


def tips(
    params: float,
    gpus: int,
    gpu_gb: float,
    *,
    trainable: float = 0,
    footprint: float = 1e9,
    save_s: float | None = None,
    home: bool = False,
    every_minutes: float = 30.0,
) -> str:
    """The advice for a model of `params` parameters (all trainable unless said)."""
    model = plan.Model(int(params), int(trainable or params), 0, int(params / 32))
    cluster = plan.Cluster(gpus_per_node=gpus, gpu_gb=gpu_gb, home_quota_gb=40)
    ddp = plan.state_bytes(model, "ddp", gpus, 2)
    fsdp = plan.state_bytes(model, "fsdp", gpus, 2)
    found = plan.advice(
        model,
        cluster,
        ddp=ddp,
        fsdp=fsdp,
        footprint=footprint,
        save_s=save_s,
        runs_in_home=home,
        every_minutes=every_minutes,
    )
    return "\n".join(found)


def test_advice_follows_the_arithmetic() -> None:
    small = tips(1e8, 1, 40)  # 1.6 GB
    assert "strategy: ddp (the default) fits" in small
    assert "fsdp" not in small and "LoRA" not in small and "storage" not in small
    # 1B: 16 GB per GPU under ddp, over 60 % of a 20 GB slice; 4 GB each when sharded on 4.
    sharded = tips(1e9, 4, 20)
    assert "strategy: dist.strategy=fsdp: 4.1 GB per GPU sharded over 4 GPU(s)" in sharded
    assert "activation_checkpointing" not in sharded
    assert "LoRA: with the base frozen the state is about 4.0 GB per GPU under ddp" in sharded
    tight = tips(2.5e9, 4, 40)  # 10 GB + 0.3 GB of gathered blocks of 24 GB usable: under half
    assert "dist.strategy=fsdp" in tight and "activation_checkpointing" not in tight
    tighter = tips(3.5e9, 4, 40)  # 14 GB + 0.4 GB: over half of the usable 24 GB
    assert "train.activation_checkpointing=blocks" in tighter
    huge = tips(8e9, 4, 40)  # 8B full fine-tune: 32 GB each even on four A100 40 GB
    assert "does not fit: 33.0 GB per GPU even sharded over 4 GPU(s)" in huge
    adapters = tips(8e9, 4, 40, trainable=1e7)  # LoRA: 32 GB of frozen base under ddp
    assert "dist.strategy=fsdp" in adapters and "LoRA:" not in adapters
    assert "unknown" in tips(1e8, 1, 0)


def test_advice_on_save_time_and_where_runs_live() -> None:
    assert "checkpoints: a save takes about 45 s" in tips(1e8, 1, 40, save_s=45.0)
    assert "checkpoints" not in tips(1e8, 1, 40, save_s=10.0)
    often = tips(1e8, 1, 40, save_s=25.0, every_minutes=0.5)  # a save every 30 s that takes 25
    assert "run.checkpoint_every_minutes=0.5 is close to a save (25 s)" in often
    assert "checkpoints" not in tips(1e8, 1, 40, save_s=25.0, every_minutes=0)  # off
    home = tips(1e8, 1, 40, home=True, footprint=20e9)  # half the 40 GB quota
    assert "storage: the run's checkpoints take 20.0 GB, too much for the 40 GB $HOME" in home
    assert "RUNS_DIR" in home
    assert "storage" not in tips(1e8, 1, 40, home=True, footprint=2e9)
    assert "storage" not in tips(1e8, 1, 40, home=False, footprint=20e9)


def test_save_time_is_fitted_as_a_fixed_part_plus_bytes_over_a_speed() -> None:
    fit = pkg("ops.plan")._fit
    # 0.5 s per checkpoint plus 1 GB/s: 8.5 s for 8 GB, where the 1 GB sample scaled says 12 s.
    fixed, rate = fit((1e9 / 4, 0.75), (1e9, 1.5))
    assert (round(fixed, 6), round(rate)) == (0.5, 1e9)
    speed = pkg("ops.plan").SaveSpeed(fixed, rate, 0.0, 2e9)
    assert (round(speed.save_s(8e9), 6), speed.load_s(8e9)) == (8.5, 4.0)
    assert fit((1e8, 1.0), (4e8, 1.05)) == (0.0, 4e8 / 1.05)  # too close to tell: all bytes
    assert fit((1e6, 0.002), (1e6, 0.003)) == (0.0, 1e6 / 0.003)  # one size: all bytes


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_disk_probe_writes_only_into_a_folder_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit of `plan`'s disk probe: its samples go into a temporary folder of its own in
    the runs folder, removed after, also when a sample fails; a run there stays as it was."""
    runs = tmp_path / "runs"
    (runs / "mine").mkdir(parents=True)
    (runs / "mine" / "metrics.csv").write_text("step,loss\n1,0.5\n", "utf-8")
    before = _files(runs)
    cfg = pkg("task").load_config(None, ["task.name=toy_tasks.blobs", "model.hidden=16"])
    speed = plan.save_speed(cfg, runs, 1)
    assert speed.save_rate > 0 and speed.load_rate > 0
    assert (_files(runs), sorted(p.name for p in runs.iterdir())) == (before, ["mine"])

    def full_disk(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan.Checkpointer, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        plan.save_speed(cfg, runs, 1)
    assert (_files(runs), sorted(p.name for p in runs.iterdir())) == (before, ["mine"])


@pytest.mark.slow
def test_plan_command_measures_the_disk_and_reads_the_cluster(project: Path) -> None:
    (project / "configs").mkdir()
    (project / "configs" / "cluster.toml").write_text(
        '[cluster]\npartition = "grete"\nnodes = 2\ngpus_per_node = 4\n'
        'gpu_memory = "40G or 80G"\nhome_quota_gb = 40\n'
    )
    args = ["task.name=toy_tasks.blobs", "model.hidden=16", "--disk-mb", "8"]
    out = run_cli("plan", *args, project=project)
    assert out.returncode == 0, out.stderr
    model = pkg("task").load_task(
        pkg("task").load_config(None, ["task.name=toy_tasks.blobs", "model.hidden=16"]),
        pkg("settings").get_settings(),
    )
    params = sum(p.numel() for p in model.build_model().parameters())
    assert f"{params:,} parameters, {params:,} trainable" in out.stdout
    assert "partition grete: 2 node(s) x 4 GPU(s), 40 GB each" in out.stdout
    assert f"ddp    {16 * params / GB:10.3f} GB" in out.stdout
    assert (
        "MB/s saving, " in out.stdout
        and "loading samples of up to 8 MB as ddp checkpoints" in out.stdout
    )
    assert "strategy: ddp (the default) fits" in out.stdout
    assert [p.name for p in (project / "runs").iterdir()] == []  # the speed test's files are gone
    fsdp = run_cli("plan", *args[:2], "dist.strategy=fsdp", *args[2:], project=project)
    assert "8 MB as fsdp checkpoints are (checksums, fsync)" in fsdp.stdout, fsdp.stderr
    assert [p.name for p in (project / "runs").iterdir()] == []
    out = run_cli("plan", *args, "--gpus", "1", "--gpu-memory", "94", project=project)
    assert "1 node(s) x 1 GPU(s), 94 GB each" in out.stdout
    out = run_cli("plan", *args, "--gpus", "-2", project=project)
    assert (out.returncode, out.stderr) == (
        2,
        "error: --gpus: must be between 0 and 100000, got -2\n",
    )
    for flag, value in (("--gpus", "1000000000"), ("--gpu-memory", "nan"), ("--gpu-memory", "inf")):
        out = run_cli("plan", *args, flag, value, project=project)
        assert (out.returncode, out.stderr.count("\n")) == (2, 1), out.stderr
        assert f"error: {flag}: must be between 0 and" in out.stderr
    out = run_cli("plan", *args[:2], "--disk-mb", "9000000", project=project)
    assert (out.returncode, out.stderr.count("\n")) == (2, 1), out.stderr
    assert "--disk-mb: 9000000 MB is more than half of the" in out.stderr
