"""The language-model example: its pretrained base, token shards, LoRA and text sample.

Stopping and resuming it exactly, evaluating it and two processes are covered with the other
shipped examples in test_tasks.py.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import CORPUS, example_task, final_weights, pkg

config, data, trainer = pkg("config"), pkg("data.processed"), pkg("engine.loop.trainer")
pretrained, settings = pkg("data.pretrained"), pkg("settings")
checkpoint, export = pkg("engine.state.checkpoint"), pkg("ops.export")
TINY = [
    "run.progress=log",
    "data.verify_raw=false",
    "task.name=lm",
    "task.context=16",
    "task.heads=2",
    "task.pretrain_steps=5",
    "model.hidden=16",
    "model.depth=2",
    "train.batch_size=16",
]


def export_args(project: Path, run: str = "lora") -> tuple[Path, Path, object]:
    """export_run's arguments for a run of this project."""
    return project / "runs" / run, project / "exports" / run, settings.get_settings()


def load(*overrides: str):
    cfg = pkg("task").load_config(None, [*TINY, *overrides])
    return pkg("task").load_task(cfg, settings.get_settings())


@pytest.fixture
def lm_project(project: Path) -> Path:
    if not example_task("lm"):
        pytest.skip("the language-model example is not part of this project (any more)")
    (project / "data" / "raw").mkdir(parents=True)
    (project / "data" / "raw" / CORPUS.name).write_bytes(CORPUS.read_bytes())
    return project


def test_prepare_shards_the_text_and_lora_trains_only_the_adapters(lm_project: Path) -> None:
    task = load()
    line = data.prepare(task)
    assert "base model pre-trained on 5743 tokens (5 steps)" in line
    base = task.processed_dir / "base"
    index = json.loads((base / pretrained.INDEX).read_text())
    assert len(set(index["weight_map"].values())) == 2  # sharded, as a hub download is
    base_weights = pretrained.read_weights(base)
    assert base_weights.keys() == task.new_model().state_dict().keys()

    # Windows come back from the memory-mapped shards as the text's bytes, shifted by one.
    text = CORPUS.read_bytes()
    windows = task.datasets(task.processed_dir).train
    inputs, targets = windows[1]
    start = 5743 + 16  # the second training window: one stride into the fine-tuning text
    assert bytes(inputs.tolist()) == text[start : start + 16]
    assert torch.equal(inputs[1:], targets[:-1])

    tuned = load("run.name=lora", "task.lora_rank=2", "model.init_from=data/processed/lm/base")
    result = trainer.train(tuned.cfg, tuned)
    assert result.summary["status"] == "finished"
    assert result.summary["val_perplexity"] > 1
    final = final_weights(lm_project / "runs" / "lora")
    # The frozen base: exactly the pretrained weights (a checkpoint may leave it out). The
    # export is the base model with each adapter merged in: W + scale B A, under its names.
    exported = load_file(export.export_run(*export_args(lm_project)) / "model.safetensors")
    assert exported.keys() == base_weights.keys()
    layers = {f"{layer}.weight": key for key, layer in tuned.build_model().layers.items()}
    scale = tuned.options.lora_alpha / tuned.options.lora_rank
    for key, value in base_weights.items():
        assert torch.equal(final.get(f"base.{key}", value), value), key
        merged = value
        if key in layers:
            a, b = (final[f"adapters.{layers[key]}.{p}"] for p in "ab")
            merged = value + scale * (b @ a)
        torch.testing.assert_close(exported[key], merged, rtol=0, atol=1e-6)
    assert len(layers) == 4
    assert not torch.equal(exported["blocks.0.qkv.weight"], base_weights["blocks.0.qkv.weight"])
    exports_in_bf16(lm_project / "runs" / "lora", exported, final, layers)
    adapters = {k: v for k, v in final.items() if k.startswith("adapters.")}
    assert len(adapters) == 2 * 2 * 2  # a and b of qkv and proj in each of the 2 blocks
    assert all(v.abs().sum() > 0 for k, v in adapters.items() if k.endswith(".b"))  # trained
    trained = sum(v.numel() for v in adapters.values())
    assert trained < sum(v.numel() for v in base_weights.values()) / 5

    sample = lm_project / "reports" / "figures" / "lora" / "sample.txt"
    assert sample.read_text().startswith("--- 'The cluster' ---\nThe cluster")

    # A checkpoint that leaves the frozen base out is exported whole: from model.init_from.
    state = checkpoint.load_latest(lm_project / "runs" / "lora" / "checkpoints")
    frozen = [f"base.{key}" for key in base_weights]
    state["model"] = {k: v for k, v in state["model"].items() if k not in frozen}
    state["frozen"] = {"keys": frozen, "digest": ""}
    checkpoint.save(state, lm_project / "runs" / "slim" / "checkpoints", 1, 1)
    slim = load_file(export.export_run(*export_args(lm_project, "slim")) / "model.safetensors")
    assert slim.keys() == exported.keys()
    assert all(torch.equal(slim[k], exported[k]) for k in slim)
    # ... and evaluated whole, with the same result as the run that stored everything.
    evaluate_run = pkg("engine.loop.evaluate").evaluate_run
    evaluated = [
        evaluate_run(lm_project / "runs" / r, settings.get_settings()) for r in ("lora", "slim")
    ]
    assert evaluated[0]["perplexity"] == evaluated[1]["perplexity"] > 1


def exports_in_bf16(
    run_dir: Path,
    merged: dict[str, torch.Tensor],
    final: dict[str, torch.Tensor],
    layers: dict[str, str],
) -> None:
    """A LoRA run's two exports in bf16, by the command lines docs/fine-tune-lm.md shows.

    Merged: the fp32 merge (`merged`), cast. The adapters alone: as peft names them, each of
    `layers` (the adapted weight's name -> its adapter's key) with its A and B.
    """
    cli = pkg("cli")
    assert cli.main(["export", "--run", run_dir.name, "--dtype", "bf16"]) == 0
    half = load_file(run_dir / "export" / "model.safetensors")
    assert all(torch.equal(half[k], v.to(torch.bfloat16)) for k, v in merged.items())
    assert cli.main(["export", "--run", run_dir.name, "--adapters", "--dtype", "bf16"]) == 0
    written = load_file(run_dir / "adapters" / "adapter_model.safetensors")
    assert len(written) == 2 * len(layers)
    for weight, key in layers.items():
        for part, name in (("a", "lora_A"), ("b", "lora_B")):
            in_file = written[f"base_model.model.{weight.removesuffix('.weight')}.{name}.weight"]
            assert torch.equal(in_file, final[f"adapters.{key}.{part}"].to(torch.bfloat16))


def test_a_base_of_another_size_is_refused_naming_a_key(lm_project: Path) -> None:
    for bad, message in [
        ("task.stride=0", "task.stride: must be > 0, got 0"),
        ("task.pretrain_fraction=1.0", "task.pretrain_fraction: must be between 0 and 1"),
        ("task.lora_rank=-1", "task.lora_rank: must be >= 0, got -1"),
    ]:
        with pytest.raises(pkg("errors").ConfigError, match=message):
            load(bad)
    data.prepare(load())
    task = load("run.name=wide", "model.hidden=32", "model.init_from=data/processed/lm/base")
    with pytest.raises(pkg("errors").CheckpointError, match=r"shape embed\.weight \[256, 16\]"):
        trainer.train(task.cfg, task)
