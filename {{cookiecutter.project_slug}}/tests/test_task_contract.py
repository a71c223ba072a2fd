"""Every task in src/<package>/tasks/ keeps the contract the trainer relies on.

Each task is checked on a few samples of the project's real data: its processed data when
`prepare` has made it, or else the output of its own `prepare` from data/raw, made here in a
temporary data folder. That folder's raw/ and external/ are the project's (links), so a task
reads them as training does: files a stream reads from data/external, as the `corpus` task
of docs/bring-your-own-task.md does, are found here too. Its interim/ is its own: a
`prepare` may write there, and these tests write nothing into the project's data.

A task whose data cannot be made fails with the command that makes it; one whose data sets
cannot be read (a `DataError`, a missing file) fails in one line that names the file. Files
below data/external stay out of git, so a fresh clone has none: that line says to copy them
in, as on the machine that trains. Neither is a skip, which would leave the task unchecked
with the suite green. A task that needs a setting no test can give, such as hub_lm's model
folder, is skipped naming it. The checks: samples that can be batched (by the task's
`collate`), a scalar finite loss, evaluation sums that add up over batches (so they add up
over processes too), the declared metrics, and the same initial weights on every process.
"""

import dataclasses
from itertools import islice
from pathlib import Path
from typing import NoReturn

import pytest
import torch

from conftest import EXAMPLE_RAW, ROOT, pkg

task_mod, config, batches = pkg("task"), pkg("config"), pkg("engine.loop.batches")
errors, processed = pkg("errors"), pkg("data.processed")


# The project's data folders that the temporary one links: read as training reads them.
LINKED = ("raw", "external")


@pytest.fixture(scope="session")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder for the tasks without processed data (raw/ and external/ are linked)."""
    return tmp_path_factory.mktemp("contract-data")


def in_project(text: str, elsewhere: Path, data_dir: Path) -> str:
    """`text` with the linked folders of `elsewhere` named as the project's own."""
    for folder in LINKED:
        text = text.replace(str(elsewhere / folder), str(data_dir / folder))
    return text


def configured(name: str, elsewhere: Path):
    """The task as the command line would load it (configs/train.toml, then its own file)."""
    configs = ROOT / "configs"
    path = configs / "train.toml"
    cfg = pkg("task").load_config(
        path if path.is_file() else None, [f"task.name={name}"], task_dir=configs / "tasks"
    )
    settings = pkg("settings").get_settings()
    task = task_mod.load_task(cfg, settings)
    if task.processed_dir.is_dir():  # prepared by the user, maybe with settings given then
        return opened(task, elsewhere, settings.data_dir)
    for folder in LINKED:  # (a link to a folder that is missing reads as an empty one)
        if not (elsewhere / folder).is_symlink():
            (elsewhere / folder).symlink_to(settings.data_dir / folder, target_is_directory=True)
    task = task_mod.load_task(cfg, dataclasses.replace(settings, data_dir=elsewhere))
    if task.processed_dir.is_dir():  # prepared here by an earlier test
        return opened(task, elsewhere, settings.data_dir)
    try:
        processed.prepare(task)
    except errors.ConfigError as err:  # a setting only the user can give
        pytest.skip(f"task {name}: {err}")
    except (errors.DataError, OSError) as err:
        if name in EXAMPLE_RAW and not EXAMPLE_RAW[name].is_file():  # replaced by the user's
            pytest.skip(f"the {name} example's {EXAMPLE_RAW[name].name} is gone from data/raw")
        why = in_project(str(err), elsewhere, settings.data_dir)
        one_line(
            f"task {name}: no processed data, and its prepare cannot make it from "
            f"{settings.raw_dir}: {why}. Put its raw data in place, then run "
            f"`prepare task.name={name}`"
        )
    return opened(task, elsewhere, settings.data_dir)


def opened(task, elsewhere: Path, data_dir: Path):
    """`task`, once its data sets open: one line when their files cannot be read."""
    try:
        task.datasets(task.processed_dir)
    except errors.ConfigError as err:  # such as hub_lm's model.init_from
        pytest.skip(f"task {task.name}: {err}")
    except (errors.DataError, OSError) as err:
        why = in_project(errors.first_line(err), elsewhere, data_dir)
        if str(external := data_dir / "external") in why:  # a fresh clone has none of them
            why += (
                f". Files below {external} stay out of git: copy the ones this task reads "
                "there, as on the machine that trains"
            )
        one_line(f"task {task.name}: {why}")
    return task


def one_line(message: str) -> NoReturn:
    """Fail the test with `message` alone: no traceback, and not the error it stands for."""
    raise pytest.fail.Exception(message, pytrace=False) from None


@pytest.fixture(params=task_mod.available())
def task(request: pytest.FixtureRequest, elsewhere: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PROJECT_ROOT", str(ROOT))
    return configured(request.param, elsewhere)


def first(dataset: torch.utils.data.Dataset, n: int) -> list:
    """The first `n` samples (or fewer): by index, or from a stream by iterating it."""
    if batches.is_stream(dataset):
        return list(islice(iter(dataset), n))  # type: ignore[call-overload]
    return [dataset[i] for i in range(min(n, batches.size(dataset)))]


def test_samples_can_be_batched(task) -> None:
    sets = task.datasets(task.processed_dir)
    for split in ("train", "val", "test"):
        where = f"task {task.name}: {split} data set"
        dataset, collate = sets.get(split), task_mod.own_collate(task)
        batches.check_first_sample(dataset, where, collate)
        if batches.is_stream(dataset):  # read here; training checks it in the worker
            samples = first(dataset, 2)
            assert samples, f"{where}: the stream yields no sample"
            (collate or torch.utils.data.default_collate)(samples)


def evaluated(task, model, batch) -> tuple[dict, dict]:
    """`evaluate`'s sums, and the rows it kept (`Task.keep`), concatenated per name."""
    sums, kept = task.evaluate(model, batch), {}
    for name, rows in task.take_kept():
        kept.setdefault(name, []).append(rows)
    return sums, {name: torch.cat(rows) for name, rows in kept.items()}


def losses(task, model, batch) -> dict[str, torch.Tensor]:
    """The training loss, or each named optimizer's (a task whose optimizer() is a dict)."""
    made = task.optimizer(model)
    if isinstance(made, dict):
        return {f"named_loss({n!r})": task.named_loss(n, model, batch) for n in made}
    return {"loss()": task.loss(model, batch)}


def differs(key: str, parts: tuple[int, int], whole: torch.Tensor, added: torch.Tensor) -> str:
    """Why `evaluate`'s `key` of two batches does not add up to the whole batch's."""
    largest = (added.double() - whole.double()).abs().max().item()
    return (
        f"evaluate's {key!r} for one batch of {sum(parts)} samples differs from the sum over "
        f"batches of {parts[0]} and {parts[1]} by up to {largest:.3g}: it depends on how the "
        "samples are batched. Return sums or counts (not means), and draw no random numbers "
        "per batch (fix them per sample in the data set); keep per-sample rows with self.keep"
    )


def test_loss_is_a_finite_scalar_and_sums_add_up(task) -> None:
    samples = first(task.datasets(task.processed_dir).val, 8)
    n = len(samples)
    parts = (n // 2, n - n // 2)
    torch.manual_seed(0)
    model = task.build_model().eval()
    with torch.no_grad():
        found = losses(task, model, task.collate(samples))
        task.take_records()
        whole, kept = evaluated(task, model, task.collate(samples))
        halves, kept_halves = zip(
            *(
                evaluated(task, model, task.collate(part))
                for part in (samples[: n // 2], samples[n // 2 :])
            ),
            strict=True,
        )
    for name, loss in found.items():
        assert loss.dim() == 0, f"task {task.name}: {name} must return the batch mean, a scalar"
        assert torch.isfinite(loss), f"task {task.name}: {name} is {loss.item()}"
    assert whole.keys() == halves[0].keys()
    for key, value in whole.items():
        added = halves[0][key] + halves[1][key]
        # float32 sums in another order: equal up to rounding
        close = torch.allclose(added.double(), value.double(), rtol=1e-5, atol=1e-5)
        assert close, f"task {task.name}: {differs(key, parts, value, added)}"
    for name, rows in kept.items():  # kept rows: one per sample, whatever the batches
        halves_rows = torch.cat([part[name] for part in kept_halves])
        close = halves_rows.shape == rows.shape and torch.allclose(halves_rows, rows)
        assert close, (
            f"task {task.name}: the rows kept as {name!r} for one batch of {n} samples differ "
            f"from those of batches of {parts[0]} and {parts[1]}"
            + (
                f" by up to {(halves_rows - rows).abs().max().item():.3g}"
                if halves_rows.shape == rows.shape
                else f" in shape ({list(rows.shape)} and {list(halves_rows.shape)})"
            )
            + ": keep one row per sample, computed from that sample alone"
        )
    metrics = task.summarize({**whole, **kept})
    assert list(metrics) == list(task.metrics)
    assert all(isinstance(v, float) for v in metrics.values())


def test_initial_weights_depend_only_on_the_seed(task) -> None:
    task.datasets(task.processed_dir)
    models = []
    for _ in range(2):
        torch.manual_seed(123)
        models.append(task.build_model().state_dict())
    for key, value in models[0].items():
        assert torch.equal(value, models[1][key]), key
