"""The optional task hooks: collate, optimizer and schedule, module modes; and their defaults."""

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import assert_identical, blobs, final_weights, pkg
from toy_tasks.blobs import Blobs
from toy_tasks.sequences import Sequences

trainer, batches, config = pkg("engine.loop.trainer"), pkg("engine.loop.batches"), pkg("config")
DataError = pkg("errors").DataError
DistEnv = pkg("engine.parallel.distributed").DistEnv

FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "run.log_every_steps=5"]


def task_of(cls: type, *overrides: str) -> Any:
    """An instance of `cls` (a test task class) configured like `toy_tasks.blobs`."""
    cfg = pkg("task").load_config(None, ["task.name=toy_tasks.blobs", *FAST, *overrides])
    return cls(cfg, pkg("settings").get_settings())


def stopped_and_resumed(make: Any, *overrides: str) -> tuple[dict, dict]:
    """Final weights of a run cut after 7 steps and resumed, and of one trained straight."""
    trainer.train(
        (task := make(*overrides, "run.name=cut", "run.max_steps_this_segment=7")).cfg, task
    )
    trainer.train((task := make(*overrides, "run.name=cut")).cfg, task)
    trainer.train((task := make(*overrides, "run.name=straight")).cfg, task)
    runs = task.settings.runs_dir
    return final_weights(runs / "cut"), final_weights(runs / "straight")


def sequences(*overrides: str) -> Any:
    cfg = pkg("task").load_config(None, ["task.name=toy_tasks.sequences", *FAST, *overrides])
    return pkg("task").load_task(cfg, pkg("settings").get_settings())


def test_variable_length_samples_pad_per_batch_and_resume_exactly(project: Path) -> None:
    args = ["train.epochs=2", "train.batch_size=16", "data.num_workers=2", "model.hidden=16"]
    cut, straight = stopped_and_resumed(sequences, *args)
    assert_identical(cut, straight)
    metrics = (project / "runs" / "straight" / "metrics.csv").read_text()
    assert metrics.count(",val,") == 2  # validation went through the task's collate too


def test_samples_that_do_not_stack_get_one_line_naming_the_hook() -> None:
    data = Sequences(8, vocab=16, max_len=24, seed=0)
    with pytest.raises(DataError, match=r"items 0-1 cannot be batched .*task's collate\(\)"):
        batches.check_first_sample(data, "train data set")
    batches.check_first_sample(data, "train data set", sequences().collate)


def test_a_data_sets_own_getitems_loads_whole_batches() -> None:
    class Bulk(torch.utils.data.Dataset):
        calls = 0

        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> torch.Tensor:
            raise AssertionError("one sample at a time")

        def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
            Bulk.calls += 1
            return [torch.tensor([float(i)]) for i in indices]

    loading = pkg("engine.loop.loading").Loading(
        batch_size=4,
        denv=DistEnv(),
        seed=0,
        device=torch.device("cpu"),
        workers=0,
        prefetch=2,
        collate=None,
    )
    got = list(batches.EvalBatches(Bulk(), loading))
    assert torch.equal(torch.cat(got).flatten(), torch.arange(10.0))
    assert Bulk.calls == 3


class SgdStep(Blobs):
    """SGD with momentum and a step schedule instead of the default AdamW and cosine."""

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.param_groups(model), lr=0.05, momentum=0.9)

    def schedule(self, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
        del total_steps
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)


def test_a_tasks_optimizer_and_schedule_are_used_and_resume_exactly(project: Path) -> None:
    cut, straight = stopped_and_resumed(
        lambda *a: task_of(SgdStep, *a), "train.epochs=2", "train.batch_size=32"
    )
    assert_identical(cut, straight)
    state = pkg("engine.state.checkpoint").load_latest(project / "runs" / "cut" / "checkpoints")
    assert state["optimizer"]["param_groups"][0]["momentum"] == 0.9
    steps = state["position"]["step"]
    assert state["scheduler"]["_last_lr"][0] == pytest.approx(0.05 * 0.5 ** (steps // 10))


class FrozenNorm(Blobs):
    """A BatchNorm in front of the model; `on_mode` keeps it in eval mode while training."""

    keep_norm = True

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.BatchNorm1d(self.options.features), super().build_model())

    def on_mode(self, model: nn.Module, training: bool) -> None:
        if training and self.keep_norm:
            model[0].eval()


@pytest.mark.parametrize("keep", [True, False])
def test_on_mode_keeps_a_frozen_norm_in_eval_mode(project: Path, keep: bool) -> None:
    task = task_of(FrozenNorm, "train.epochs=2", f"run.name={keep}")
    task.keep_norm = keep
    trainer.train(task.cfg, task)
    tracked = final_weights(project / "runs" / str(keep))["0.num_batches_tracked"]
    assert (int(tracked) == 0) == keep  # the default (keep False) updates the statistics


def test_defaults_are_adamw_and_warmup_then_cosine(project: Path) -> None:
    task = blobs(*FAST, "train.warmup_steps=3")
    model = task.build_model()
    optimizer = task.optimizer(model)
    schedule = task.schedule(optimizer, total_steps=10)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [g["lr"] for g in optimizer.param_groups] == [task.cfg.train.lr / 3] * 2
    assert pkg("task").own_collate(task) is None
    assert isinstance(schedule, torch.optim.lr_scheduler.LambdaLR)
