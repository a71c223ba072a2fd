"""The recipes of docs/bring-your-own-task.md ("Training that changes as it goes"), as printed.

Each recipe is a whole task module in the guide. It is written here as it stands (its
`from ..api import` made absolute) into a folder of its own, so the tests check the code a
reader copies: stopped mid-epoch and resumed bit-exactly (weights, averaged weights,
optimizer states), with accumulation and bf16 autocast on the CPU, and with 2 processes
under ddp and fsdp (slow).
"""

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from conftest import PACKAGE, ROOT, assert_identical, pkg, run_cli
from test_task_contract import test_loss_is_a_finite_scalar_and_sums_add_up as contract

trainer, checkpoint = pkg("engine.loop.trainer"), pkg("engine.state.checkpoint")
GUIDE = ROOT / "docs" / "bring-your-own-task.md"
MODULE = re.compile(r"<!-- write src/\S+/tasks/(\w+)\.py -->\n```python\n(.*?)```", re.S)
RECIPES = ("averaged", "gan", "distill")
FAST = ["data.verify_raw=false", "run.progress=log", "run.log_every_steps=2"]
COMMON = [*FAST, "run.figures=false", "train.epochs=2", "train.batch_size=32"]


@pytest.fixture(scope="session")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package `recipes` with the guide's task modules; importable here and in children."""
    folder = tmp_path_factory.mktemp("recipes")
    (folder / "recipes").mkdir()
    (folder / "recipes" / "__init__.py").write_text("", encoding="utf-8")
    found = dict(MODULE.findall(GUIDE.read_text(encoding="utf-8")))
    assert set(RECIPES) <= found.keys(), f"{GUIDE.name} lacks recipes {set(RECIPES) - found.keys()}"
    for name in RECIPES:
        code = found[name].replace("from ..api import", f"from {PACKAGE}.api import")
        (folder / "recipes" / f"{name}.py").write_text(code, encoding="utf-8")
    sys.path.insert(0, str(folder))
    return folder


def load(name: str, *overrides: str) -> Any:
    cfg = pkg("task").load_config(None, [f"task.name=recipes.{name}", *COMMON, *overrides])
    return pkg("task").load_task(cfg, pkg("settings").get_settings())


def train(name: str, *overrides: str) -> Any:
    task = load(name, *overrides)
    return trainer.train(task.cfg, task)


def final_state(run_dir: Path) -> dict[str, Any]:
    state = checkpoint.load_latest(run_dir / "checkpoints")
    assert state is not None, f"no checkpoint in {run_dir}"
    return state


def assert_same_run(a: Path, b: Path) -> None:
    """Bit-identical weights, averaged weights and optimizer states of two runs."""
    first, second = final_state(a), final_state(b)
    assert_identical(first["model"], second["model"])
    assert_identical(first.get("averaged", {}), second.get("averaged", {}))
    assert first["position"] == second["position"]
    states = [s["optimizer"] for s in (first, second)]
    flat = [torch.utils._pytree.tree_leaves(s) for s in states]
    assert len(flat[0]) == len(flat[1])
    for x, y in zip(*flat, strict=True):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y


def stopped_and_resumed(project: Path, name: str, *args: str, steps: int = 5) -> None:
    whole = train(name, "run.name=whole", *args)
    assert whole.summary["status"] == "finished"
    cut = train(name, "run.name=cut", f"run.max_steps_this_segment={steps}", *args)
    assert cut.summary["step"] == steps
    train(name, "run.name=cut", *args)
    assert_same_run(project / "runs" / "whole", project / "runs" / "cut")


def rows(run_dir: Path, phase: str) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return [row for row in csv.DictReader(f) if row["phase"] == phase]


ACCUM_BF16 = ["train.grad_accum_steps=2", "train.precision=bf16"]


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_resumes_bit_exactly_with_accumulation_and_bf16(
    project: Path, recipes: Path, name: str
) -> None:
    del recipes
    stopped_and_resumed(project, name, *ACCUM_BF16, "train.lr=0.001")


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_keeps_the_task_contract(recipes: Path, name: str) -> None:
    del recipes
    contract(load(name))


def test_the_contract_names_what_differs_when_evaluation_draws_per_batch(recipes: Path) -> None:
    """The mistake the contract exists for: noise drawn per batch in `evaluate`."""
    del recipes
    task = load("gan")
    fixed = task.evaluate

    def per_batch(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        real, noise = batch
        return fixed(model, (real, torch.randn_like(noise)))

    task.evaluate = per_batch
    message = r"'loss' for one batch of 8 samples differs from the sum over batches of 4 "
    with pytest.raises(AssertionError, match=message + r"and 4 by up to \d"):
        contract(task)


def test_where_is_the_same_for_each_micro_batch_of_a_step(project: Path, recipes: Path) -> None:
    del project, recipes
    task, seen = load("averaged", "train.grad_accum_steps=2", "run.name=where"), []
    loss = task.loss
    task.loss = lambda model, batch: seen.append(task.where) or loss(model, batch)
    result = trainer.train(task.cfg, task)
    total = result.summary["total_steps"]
    assert [w.step for w in seen] == [s for s in range(total) for _ in range(2)]
    assert seen[0].fraction == 0.0 and seen[-1].fraction == (total - 1) / total
    assert {w.epoch for w in seen} == {0, 1}


def test_averaged_weights_are_what_validation_evaluate_and_export_use(
    project: Path, recipes: Path
) -> None:
    del recipes
    run = project / "runs" / "ema"
    train("averaged", "run.name=ema", "run.best_metric=loss")
    state = final_state(run)
    assert state["averaging"] == {"updates": state["position"]["step"], "use": True}
    model = load("averaged").build_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert state["averaged"].keys() == trainable
    assert any(not torch.equal(state["averaged"][n], state["model"][n]) for n in trainable)
    best = torch.load(run / "best.pt", weights_only=True)  # validation used the averages
    assert_identical({n: best["model"][n] for n in trainable}, state["averaged"])
    out = run_cli("export", "--run", "ema", project=project, env=recipes_env(project))
    assert out.returncode == 0, out.stdout + out.stderr
    exported = next(run.glob("export/*.safetensors"))
    assert_identical({n: load_file(exported)[n] for n in trainable}, state["averaged"])
    # Without `use` the trained weights stay what validation scores: another val loss.
    train("averaged", "run.name=plain", "task.use_ema=false")
    averaged, plain = rows(run, "val")[-1]["loss"], rows(project / "runs" / "plain", "val")[-1]
    assert averaged != plain["loss"]
    manual = pkg("engine.loop.evaluate").evaluate_run(run, pkg("settings").get_settings(), "cpu")
    model.load_state_dict({**state["model"], **state["averaged"]})
    assert manual["loss"] == pytest.approx(manual_loss(model), rel=1e-6)


def test_the_averages_warm_up_ends_where_the_guide_says() -> None:
    """The configured decay takes over at step (10 d - 1) / (1 - d), as the guide prints."""
    ema = pkg("api").EMA(0.99)
    assert [ema.decay_at(step) for step in (2, 26)] == [0.25, 0.75]
    text = " ".join(GUIDE.read_text(encoding="utf-8").split())
    assert "890 for `d = 0.99`, 8 990 for 0.999, 89 990 for 0.9999" in text
    for decay, step in ((0.99, 890), (0.999, 8990), (0.9999, 89990)):
        ema = pkg("api").EMA(decay)
        assert ema.decay_at(step) == decay > ema.decay_at(step - 1)
        assert round((10 * decay - 1) / (1 - decay)) == step


def manual_loss(model: torch.nn.Module) -> float:
    """The averaged recipe's test loss, computed here from a model and the task's data."""
    data = load("averaged").datasets(Path()).test
    inputs, labels = data.tensors
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model.eval()(inputs).float(), labels).item()


def recipes_env(project: Path) -> dict[str, str]:
    """A child process's PYTHONPATH with the recipes package (cli_env sets the rest)."""
    del project
    folder = next(p for p in sys.path if Path(p, "recipes", "gan.py").is_file())
    return {"PYTHONPATH": ":".join([str(ROOT / "src"), str(ROOT / "tests"), folder])}


def test_the_gan_steps_both_optimizers_on_every_real_batch(project: Path, recipes: Path) -> None:
    del recipes
    task, seen = load("gan", "train.grad_accum_steps=2", "run.name=gan"), []
    named_loss = task.named_loss

    def counted(name: str, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        seen.append((name, batch[0].sum().item()))
        return named_loss(name, model, batch)

    task.named_loss = counted
    result = trainer.train(task.cfg, task)
    steps = result.summary["step"]
    real = [total for name, total in seen if name == "discriminator"]
    assert len(real) == 2 * steps  # every micro-batch of every step
    assert real == [total for name, total in seen if name == "generator"]
    assert len(set(real)) == len(real)  # each a batch of its own
    state = final_state(project / "runs" / "gan")
    counts = {int(s["step"]) for s in state["optimizer"][0]["state"].values()}
    counts |= {int(s["step"]) for s in state["optimizer"][1]["state"].values()}
    assert counts == {steps}  # each optimizer counted every step
    train_rows = rows(project / "runs" / "gan", "train")
    last = train_rows[-1]
    parts = float(last["loss_discriminator"]) + float(last["loss_generator"])
    assert float(last["loss"]) == pytest.approx(parts, rel=1e-5)
    first = train_rows[0]  # (the last is 0: the cosine schedule's end)
    assert float(first["lr_discriminator"]) == float(first["lr_generator"]) > 0


def test_resuming_with_other_optimizers_is_one_line(project: Path, recipes: Path) -> None:
    del project, recipes
    train("gan", "run.name=changed", "run.max_steps_this_segment=3")
    task = load("gan", "run.name=changed")
    task.optimizer = lambda model: torch.optim.Adam(model.parameters())
    task.loss = lambda model, batch: task.named_loss("generator", model, batch)
    with pytest.raises(
        pkg("errors").CheckpointError, match=r"holds 2 schedule\(s\), the task now 1"
    ):
        trainer.train(task.cfg, task)


def test_the_gan_draws_its_figure_from_the_model_the_same_each_time(
    project: Path, recipes: Path
) -> None:
    del recipes
    train("gan", "run.name=drawn", "run.figures=true", "train.epochs=1")
    figure = pkg("settings").get_settings().figures_dir / "drawn" / "generated.png"
    first = figure.read_bytes()
    pkg("engine.loop.evaluate").evaluate_run(
        project / "runs" / "drawn", pkg("settings").get_settings(), "cpu"
    )
    assert figure.read_bytes() == first  # seeded: the same weights draw the same figure


def test_a_frozen_teacher_is_kept_once_and_evaluates_and_exports(
    project: Path, recipes: Path
) -> None:
    del recipes
    run = project / "runs" / "distill"
    train("distill", "run.name=distill")
    state = final_state(run)
    teacher = {k for k in state["model"] if k.startswith("teacher.")}
    assert teacher and state["frozen"] is None
    student = {k[8:]: v for k, v in state["model"].items() if k.startswith("student.")}
    # The default groups hold the student alone: the frozen teacher takes no optimizer room.
    groups = state["optimizer"]["param_groups"]
    assert sum(len(g["params"]) for g in groups) == len(state["optimizer"]["state"])
    assert len(state["optimizer"]["state"]) == len(student)
    result = pkg("engine.loop.evaluate").evaluate_run(run, pkg("settings").get_settings(), "cpu")
    assert 0.0 <= result["accuracy"] <= 1.0
    out = run_cli(
        "export",
        "--run",
        "distill",
        "--module",
        "student",
        project=project,
        env=recipes_env(project),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    folder = run / "export-student"
    assert f"wrote {folder}: module student, final weights, fp32" in out.stdout
    assert_identical(load_file(folder / "model.safetensors"), student)  # no teacher tensor
    assert json.loads((folder / "export.json").read_text())["module"] == "student"
    alone = load("distill").build_model().student  # the folder loads into the student alone
    alone.load_state_dict(pkg("data.pretrained").read_weights(folder))
    assert_identical(alone.state_dict(), student)
    with pytest.raises(pkg("errors").ConfigError, match=r"^--module pupil: the run's model "):
        pkg("ops.export").export_run(
            run, project / "pupil", pkg("settings").get_settings(), module="pupil"
        )


def test_a_checkpoint_with_the_teacher_in_the_optimizer_resumes_exactly(
    project: Path, recipes: Path
) -> None:
    """Checkpoints of earlier releases listed the frozen teacher in the optimizer's groups."""
    del recipes
    whole = train("distill", "run.name=whole")
    assert whole.summary["status"] == "finished"
    old = load("distill", "run.name=cut", "run.max_steps_this_segment=5")
    decay = old.cfg.train.weight_decay
    old.param_groups = lambda model: [  # the earlier default: every parameter
        {"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": decay},
        {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    trainer.train(old.cfg, old)
    saved = final_state(project / "runs" / "cut")
    listed = sum(len(g["params"]) for g in saved["optimizer"]["param_groups"])
    assert listed == len(saved["model"]) > len(saved["optimizer"]["state"])  # the teacher too
    train("distill", "run.name=cut")
    assert_same_run(project / "runs" / "whole", project / "runs" / "cut")


def test_a_saved_optimizer_state_that_does_not_fit_is_one_line(recipes: Path) -> None:
    del recipes
    optim = pkg("engine.optim")
    model = load("distill").build_model()
    everything = torch.optim.AdamW(model.parameters())
    model.student(torch.ones(2, 16)).sum().backward()
    everything.step()
    saved = everything.state_dict()
    # State on a frozen parameter and none on a trained one: no earlier default saved that.
    teacher_last, student_first = saved["param_groups"][0]["params"][-1], 0
    saved["state"][teacher_last] = saved["state"].pop(student_first)
    students = torch.optim.AdamW(model.student.parameters())
    assert optim.without_frozen(saved, students) is saved  # not fitted: left as it was
    schedule = torch.optim.lr_scheduler.LambdaLR(students, lambda step: 1.0)
    with pytest.raises(pkg("errors").CheckpointError) as caught:
        optim.restore(
            [students],
            [schedule],
            [schedule.state_dict()],
            "old",
            lambda: students.load_state_dict(optim.without_frozen(saved, students)),
        )
    assert "the optimizer state does not fit" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_part_frozen_in_build_model_and_unfrozen_later_is_refused(
    project: Path, recipes: Path
) -> None:
    """The default groups leave it out: trained later, it would never change."""
    del project, recipes
    task = load("distill", "run.name=woken")
    task.on_epoch_start = lambda model, epoch: model.teacher.requires_grad_(epoch >= 1)
    with pytest.raises(pkg("errors").ConfigError) as caught:
        trainer.train(task.cfg, task)
    line = str(caught.value)
    assert line.startswith("task recipes.distill: parameter teacher.0.weight (4 in all) was "), line
    assert "freeze it in on_epoch_start instead of build_model" in line and "\n" not in line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gan_with_fp16_loss_scaling_resumes_exactly_on_a_gpu(
    project: Path, recipes: Path
) -> None:
    """One gradient scaler for both optimizers: each unscaled and stepped, one update a step."""
    del recipes
    stopped_and_resumed(project, "gan", "train.device=cuda", "train.precision=fp16")
    assert final_state(project / "runs" / "whole")["scaler"]["scale"] > 0


TWO = [
    ("averaged", ["dist.strategy=fsdp", "train.grad_accum_steps=2"]),
    ("averaged", ["train.precision=bf16"]),
    ("gan", ["train.grad_accum_steps=2", "train.precision=bf16"]),
    ("gan", ["dist.strategy=fsdp"]),
    ("distill", ["dist.strategy=fsdp", "train.precision=bf16"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "extra"), TWO, ids=[f"{n}-{'-'.join(e)}" for n, e in TWO])
def test_recipes_on_two_processes_resume_exactly(
    project: Path, recipes: Path, name: str, extra: list[str]
) -> None:
    del recipes
    args = [f"task.name=recipes.{name}", *COMMON, "train.lr=0.001", *extra]
    segment = "run.max_steps_this_segment=5"
    for run in (["run.name=whole"], ["run.name=cut", segment], ["run.name=cut"]):
        out = run_cli("train", *args, *run, project=project, torchrun=2, env=recipes_env(project))
        assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from step 5" in out.stdout
    runs = project / "runs"
    assert_same_run(runs / "whole", runs / "cut")
