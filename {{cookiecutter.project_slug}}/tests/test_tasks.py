"""The task seam: shipped tasks end to end, fine-tuning hooks, and one line for every misuse.

The shipped example tasks (digits, regression, images, stream, lm) are checked while they are
part of the project; everything else uses the test task `toy_tasks.blobs`, which makes its own data.
"""

import csv
import importlib.util
import json
import multiprocessing
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import (
    CORPUS,
    DIGITS,
    PACKAGE,
    CliHere,
    assert_identical,
    blobs,
    cli_env,
    example_task,
    final_weights,
    pkg,
    run_cli,
)

config, trainer, checkpoint = (
    pkg("config"),
    pkg("engine.loop.trainer"),
    pkg("engine.state.checkpoint"),
)
task_mod, data = pkg("task"), pkg("data.processed")
FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "run.log_every_steps=5"]
# Small enough for a loaded 2-core machine, big enough to learn something.
SHIPPED = {
    "digits": ["train.epochs=2", "model.hidden=32"],
    "regression": ["train.epochs=2", "model.hidden=32"],
    "images": [
        "train.epochs=1",
        "task.image_size=8",
        "model.channels=4",
        "data.num_workers=2",
        "train.batch_size=64",
        # AUROC: a metric over every output of the split, with the metrics extra (torchmetrics)
        *(["task.auroc=true"] if importlib.util.find_spec("torchmetrics") else []),
    ],
    # Tar shards streamed through a shuffle buffer; two workers, so the stop at step 7 leaves
    # positions in both.
    "stream": [
        "train.epochs=2",
        "model.hidden=32",
        "data.num_workers=2",
        "task.buffer=64",
        "train.schedule=constant",  # as its config file says: a stream has no planned end
    ],
    "lm": [
        "train.epochs=1",
        "task.context=16",
        "task.heads=2",
        "task.pretrain_steps=5",
        "model.hidden=16",
        "model.depth=2",
        "train.batch_size=8",
        "train.grad_accum_steps=2",
        "model.init_from=data/processed/lm/base",
    ],
}
# Test samples of each task: 10 % of the 1797 digits; the language model's are windows of 17
# tokens in the last 10 % of the text it fine-tunes on (574 tokens).
TEST_SAMPLES = {"digits": 180, "regression": 180, "images": 180, "stream": 180, "lm": 33}


def weights(project: Path, run: str) -> dict[str, torch.Tensor]:
    return final_weights(project / "runs" / run)


def stop_at_step(task: Any, step: int) -> Any:
    """The same task, but its loss sends this process SIGUSR1 during training step `step`."""

    class Interrupted(type(task)):
        calls = 0

        def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
            Interrupted.calls += 1
            if Interrupted.calls == step:
                signal.raise_signal(signal.SIGUSR1)  # as Slurm does before the time limit
            return super().loss(model, batch)

    return Interrupted(task.cfg, task.settings)


def load(name: str, *overrides: str) -> Any:
    cfg = pkg("task").load_config(None, [*FAST, f"task.name={name}", *overrides])
    return task_mod.load_task(cfg, pkg("settings").get_settings())


@pytest.fixture
def example_project(project: Path) -> Path:
    """A scratch project holding the examples' raw files."""
    if not example_task("digits"):
        pytest.skip("the shipped example is not part of this project (any more)")
    (project / "data" / "raw").mkdir(parents=True)
    for raw in (DIGITS, CORPUS):
        if raw.is_file():
            (project / "data" / "raw" / raw.name).write_bytes(raw.read_bytes())
    return project


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_task_stops_resumes_exactly_evaluates_and_draws(
    example_project: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if not example_task(name):
        pytest.skip(f"task {name} is not part of this project (any more)")
    args = SHIPPED[name]
    data.prepare(load(name, *args))
    straight = trainer.train(load(name, *args, "run.name=straight", "run.figures=true").cfg)
    assert straight.summary["status"] == "finished"

    task = load(name, *args, "run.name=resumed")
    stopped = trainer.train(task.cfg, stop_at_step(task, 7))
    assert (stopped.exit_code, stopped.summary["status"]) == (3, "stopped")
    assert "stop signal (SIGUSR1)" in capsys.readouterr().out
    resumed = trainer.train(load(name, *args, "run.name=resumed").cfg)
    assert resumed.summary["status"] == "finished"
    assert_identical(weights(example_project, "straight"), weights(example_project, "resumed"))

    # The metrics log and the summary follow the task's metrics.
    metrics = [m for m in task.metrics if m != "loss"]
    with (example_project / "runs" / "resumed" / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert header[3 : 4 + len(metrics)] == ["loss", *metrics]
    assert all(f"val_{m}" in straight.summary for m in task.metrics)

    result = pkg("engine.loop.evaluate").evaluate_run(
        example_project / "runs" / "straight", pkg("settings").get_settings(), "cpu"
    )
    assert set(task.metrics) <= result.keys()
    assert result["samples"] == TEST_SAMPLES[name]
    figures = example_project / "reports" / "figures" / "straight"
    expected = {"curves.png", *(Path(f).name for f in result["figures"])}
    expected |= {Path(f).name.replace("_test", "") for f in result["figures"]}  # validation
    assert {p.name for p in figures.iterdir()} == expected
    assert all((figures / f).stat().st_size > 1000 for f in expected)


def test_shipped_tasks_learn(example_project: Path) -> None:
    if not (example_task("digits") and example_task("regression")):
        pytest.skip("the shipped example is not part of this project (any more)")
    data.prepare(load("regression"))
    result = trainer.train(load("regression", "run.name=reg", "train.epochs=10").cfg)
    assert result.summary["val_r2"] > 0.9  # a constant guess has R² = 0
    task = load("regression")
    task.datasets(task.processed_dir)
    std = task.target_std
    assert not torch.allclose(std, torch.ones(2, dtype=std.dtype))  # pixels, not std. units
    unit_errors = {"sse": torch.ones(2), "count": torch.tensor(1.0)}
    sums = {**unit_errors, "target_sum": torch.zeros(2), "target_sq_sum": torch.ones(2)}
    # An error of one standard deviation in each output is one std in pixels.
    assert task.summarize(sums)["rmse"] == pytest.approx(float((std**2).mean() ** 0.5))
    assert "val_accuracy" not in result.summary
    assert not list((example_project / "reports").rglob("confusion*"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_task_trains_with_two_processes(example_project: Path, name: str) -> None:
    if not example_task(name):
        pytest.skip(f"task {name} is not part of this project (any more)")
    data.prepare(load(name, *SHIPPED[name]))
    # The language model as it is fine-tuned at scale: sharded (rank 1 builds it on the meta
    # device), LoRA adapters over the pretrained base read into each rank's shards.
    sharded = ["dist.strategy=fsdp", "task.lora_rank=2"] if name == "lm" else []
    out = run_cli(
        "train",
        f"task.name={name}",
        *FAST,
        *SHIPPED[name],
        *sharded,
        "run.name=two",
        "data.num_workers=1",
        project=example_project,
        torchrun=2,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 process(es) via torchrun" in out.stdout
    assert (example_project / "runs" / "two" / "summary.json").is_file()
    assert not sharded or "initial weights from" in out.stdout


def test_images_prepare_packs_the_files_into_shards(example_project: Path) -> None:
    if not example_task("images"):
        pytest.skip("the images example is not part of this project (any more)")
    task = load("images", "task.shard_mb=0.05")
    line = data.prepare(task)
    assert "1797 images of 10 classes" in line and "(grey)" in line
    shards = sorted(p.name for p in task.processed_dir.glob("train-*.bin"))
    assert len(shards) > 1  # 0.05 MB shards: the training split needs several
    rendered = example_project / "data" / "interim" / "digit_pngs"
    assert len(list(rendered.rglob("*.png"))) == 1797
    sets = task.datasets(task.processed_dir)
    image, label = sets.train[0]
    assert image.shape == (1, 16, 16)
    assert 0 <= int(label) < 10
    # Training samples are augmented: a batch's draws depend on its epoch, not on chance.
    loader = pkg("engine.loop.batches").SeededSamples(sets.train, seed=0)
    first = [
        image for image, _ in loader.__getitems__(pkg("engine.loop.batches").BatchKey(3, [5, 9]))
    ]
    again = [
        image for image, _ in loader.__getitems__(pkg("engine.loop.batches").BatchKey(3, [5, 9]))
    ]
    later = [
        image for image, _ in loader.__getitems__(pkg("engine.loop.batches").BatchKey(4, [5, 9]))
    ]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], later[0])


def test_images_keep_their_colour(example_project: Path) -> None:
    if not example_task("images"):
        pytest.skip("the images example is not part of this project (any more)")
    from PIL import Image  # noqa: PLC0415  (only with the images example)

    folder = example_project / "data" / "raw" / "colours"
    for name, rgb in {"red": (200, 10, 10), "blue": (10, 10, 200)}.items():
        (folder / name).mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (8, 8), rgb).save(folder / name / f"{i}.png")
    task = load("images", f"task.image_dir={folder}", "task.image_size=8", "task.augment=false")
    assert "20 images of 2 classes in 3 shards (RGB)" in data.prepare(task)
    sets = task.datasets(task.processed_dir)
    image, label = sets.train[0]
    assert image.shape == (3, 8, 8)
    red, blue = (200 / 255, 10 / 255, 10 / 255), (10 / 255, 10 / 255, 200 / 255)
    expected = red if task.classes[int(label)] == "red" else blue
    assert image[:, 0, 0].tolist() == pytest.approx(expected)
    assert task.build_model()(image[None]).shape == (1, 2)


def test_prepare_refuses_float_labels_for_a_classification_task(example_project: Path) -> None:
    if not example_task("digits"):
        pytest.skip("the digits example is not part of this project (any more)")
    raw = example_project / "data" / "raw" / DIGITS.name
    import gzip  # noqa: PLC0415

    rows = gzip.decompress(raw.read_bytes()).decode().splitlines()
    rows[5] = ",".join([*rows[5].split(",")[:64], "-3.17"])
    raw.write_bytes(gzip.compress("\n".join(rows).encode()))
    (example_project / "configs").mkdir()
    out = run_cli("prepare", "task.name=digits", "data.verify_raw=false", project=example_project)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert "whole-number labels 0..9, got -3.17 (sample 5)" in out.stderr
    assert "regression task" in out.stderr
    assert not (example_project / "data" / "processed" / "digits").exists()


# --- fine-tuning: initial weights, parameter groups, epoch hooks ----------------------------
def test_initial_weights_param_groups_and_freezing(project: Path) -> None:
    base = [*FAST, "train.batch_size=32", "model.hidden=16", "run.log_every_steps=1"]
    donor = blobs(*base, "run.name=donor", "train.epochs=1")
    trainer.train(donor.cfg, donor)
    donor_weights = weights(project, "donor")
    torch.save(donor_weights, project / "pretrained.pt")

    common = [
        *base,
        "run.name=tuned",
        "train.epochs=2",
        "train.warmup_steps=0",
        "train.schedule=constant",
        "model.init_from=pretrained.pt",
    ]
    options = {"freeze_epochs": 1, "first_lr": 1e-4}
    # 420 training samples // 32 = 13 steps: the first segment is exactly epoch 0.
    segment = blobs(*common, "run.max_steps_this_segment=13", **options)
    trainer.train(segment.cfg, segment)
    after_epoch0 = weights(project, "tuned")
    assert torch.equal(after_epoch0["1.weight"], donor_weights["1.weight"])  # frozen
    assert not torch.equal(after_epoch0["4.weight"], donor_weights["4.weight"])  # trained
    tuned = blobs(*common, **options)
    trainer.train(tuned.cfg, tuned)
    final = weights(project, "tuned")
    assert not torch.equal(final["1.weight"], donor_weights["1.weight"])  # unfrozen

    with (project / "runs" / "tuned" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    assert {float(r["lr_first"]) for r in rows} == {1e-4}
    assert {float(r["lr_rest"]) for r in rows} == {tuned.cfg.train.lr}


@pytest.mark.slow
def test_fine_tuning_with_frozen_layers_under_ddp(project: Path) -> None:
    out = run_cli(
        "train",
        "task.name=toy_tasks.blobs",
        *FAST,
        "run.name=ddp-frozen",
        "train.epochs=2",
        "task.freeze_epochs=1",
        "dist.find_unused_parameters=true",
        project=project,
        torchrun=2,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 process(es) via torchrun" in out.stdout


@pytest.mark.slow
def test_frozen_layers_under_ddp_without_the_setting_name_it(project: Path) -> None:
    out = run_cli(
        "train",
        "task.name=toy_tasks.blobs",
        *FAST,
        "run.name=ddp-unused",
        "train.epochs=2",
        "task.freeze_epochs=1",
        project=project,
        torchrun=2,
    )
    assert out.returncode != 0, out.stdout + out.stderr
    assert "error: some parameters got no gradient in a step" in out.stderr, out.stderr
    assert "set dist.find_unused_parameters=true" in out.stderr, out.stderr


# --- misuse: one line each -----------------------------------------------------------------
# In this process (`cli_here`): each refusal comes before any worker starts.
def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.stderr.startswith("error: "), out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    return out.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["task.name=nosuch"], 2, "task.name: no task 'nosuch'; tasks here:"),
        (["task.name=../x"], 2, "task.name: '../x' is not a module name"),
        (["task.name=toy_tasks.blobs", "task.colour=red"], 2, "unknown config key 'task.colour'"),
        (["task.name=toy_tasks.blobs", "task.n=many"], 2, "task.n: expected int, got 'many'"),
        (
            ["task.name=toy_tasks.blobs", "model.init_from=nothing.pt"],
            2,
            "model.init_from: no file",
        ),
        (
            ["task.name=toy_tasks.blobs", "model.init_from=wrong.pt"],
            1,
            "model.init_from",
        ),
        (["task.name=toy_tasks.broken", "task.fault=structure"], 1, "item 0[0] is builtins.str"),
        (["task.name=toy_tasks.broken", "task.fault=loss"], 1, "loss() must return a scalar"),
        (["task.name=toy_tasks.broken", "task.fault=empty"], 1, "val data set has no samples"),
        (["task.name=toy_tasks.broken", "task.fault=stream"], 2, "a stream with no length"),
        (["task.name=toy_tasks.blobs", "data.in_memory=yes", "task.samples=dicts"], 2, "TensorD"),
    ],
    ids=[
        "unknown",
        "path",
        "option",
        "option-type",
        "weights-missing",
        "weights-mismatch",
        "structure",
        "loss",
        "empty",
        "stream",
        "in-memory",
    ],
)
def test_misuse_gets_one_line(
    project: Path, cli_here: CliHere, args: list[str], code: int, message: str
) -> None:
    torch.save({"other.weight": torch.zeros(3, 3)}, project / "wrong.pt")
    out = cli_here("train", *FAST, "run.name=bad", *args)
    assert out.returncode == code, out.stderr
    assert message in one_line(out)
    assert "for this task and settings" not in one_line(out)  # prepare mends none of these
    assert not (project / "runs" / "bad" / "checkpoints").exists()


def test_missing_processed_data_names_the_prepare_command_for_this_task(
    cli_here: CliHere,
) -> None:
    if not example_task("digits"):
        pytest.skip("the digits example is not part of this project (any more)")
    given = ["task.name=digits", "data.verify_raw=false", "run.name=x"]
    out = cli_here("train", *given)
    assert out.returncode == 1
    command = " ".join([PACKAGE, "prepare", *given])
    hint = f"run `prepare` first; for this task and settings: `{command}`"
    assert one_line(out).rstrip().endswith(hint), out.stderr


def test_a_task_changed_under_a_run_name_is_refused(cli_here: CliHere) -> None:
    first = blobs(*FAST, "run.name=same", "train.epochs=1")
    trainer.train(first.cfg, first)
    changed = ("run.name=same", "task.name=toy_tasks.blobs", "model.hidden=8")
    out = cli_here("train", *FAST, *changed)
    assert out.returncode == 1
    assert "weights do not fit the configured model" in one_line(out)


# --- DataLoader workers end with training, whichever way it ends ----------------------------
def test_workers_are_gone_after_train_returns_stops_or_fails(project: Path) -> None:
    args = [*FAST, "train.epochs=3", "data.num_workers=2"]
    done = blobs(*args, "run.name=done", samples="dicts")
    trainer.train(done.cfg, done)
    assert multiprocessing.active_children() == []

    task = blobs(*args, "run.name=stopped", samples="dicts")
    assert trainer.train(task.cfg, stop_at_step(task, 5)).exit_code == 3
    assert multiprocessing.active_children() == []

    class Failing(type(task)):
        def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
            raise RuntimeError("a bug in the task")

    failing = Failing(task.cfg, task.settings)
    with pytest.raises(RuntimeError, match="a bug in the task") as caught:
        trainer.train(failing.cfg, failing)
    # The traceback still references the trainer's frames; the workers must be gone anyway.
    assert caught.traceback
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_two_process_loader_run_exits_after_a_stop_signal(project: Path) -> None:
    # Without the workers' shutdown, such a run stayed alive after its last line.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            PACKAGE,
            "train",
            "task.name=toy_tasks.blobs",
            *FAST,
            "run.name=loader-ddp",
            "train.epochs=200",
            "task.samples=dicts",
            "data.num_workers=2",
        ],
        cwd=project,
        env=cli_env(project),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "step 20/" in line:
            # To both ranks, as Slurm signals a job step's tasks (torchrun's agent would kill
            # its workers after a grace period of its own, which a loaded machine can exceed).
            subprocess.run(["pkill", "-TERM", "-P", str(proc.pid)], check=True)
            break
    # The rest, once every process holding the pipe ended; closes the pipe.
    lines.append(proc.communicate(timeout=120)[0])
    assert proc.returncode != 0  # torchrun reports the stop as a failure
    assert "checkpoint at step" in "".join(lines), "".join(lines)


def test_summary_json_has_the_task_metrics(project: Path) -> None:
    task = blobs(*FAST, "run.name=sj", "train.epochs=1")
    trainer.train(task.cfg, task)
    summary = json.loads((project / "runs" / "sj" / "summary.json").read_text())
    assert {"val_loss", "val_accuracy"} <= summary.keys()
