"""How the contract test (test_task_contract.py) finds what a task reads from data/external.

Its temporary data folder links the project's data/external, so a stream over files there
(the guide's `corpus` task) reads them as training does. Without them (a fresh clone: data
stays out of git) the contract fails in one line: the task's `DataError`, which names the
folder, and what to copy there.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

import test_task_contract as contract

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="the datasets extra is not installed"
)
NAME = "toy_tasks.external_parquet"  # reads DATA_DIR/external/corpus/*.parquet


def write_corpus(folder: Path) -> None:
    """Two parquet files of 8-channel readings, as another group would hand them over."""
    import pyarrow as pa  # noqa: PLC0415  (the datasets extra)
    import pyarrow.parquet as pq  # noqa: PLC0415

    folder.mkdir(parents=True)
    for part in range(2):
        x = torch.randn(40, 8, generator=torch.Generator().manual_seed(part))
        table = pa.table({"x": x.tolist(), "y": (x.sum(1) > 0).long().tolist()})
        pq.write_table(table, folder / f"part-{part}.parquet")


@pytest.mark.parametrize("prepared", [False, True], ids=["temporary-folder", "prepared"])
def test_a_stream_over_external_files_keeps_the_contract(
    project: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    prepared: bool,
) -> None:
    # datasets pauses 5 s at the end of each shuffled pass (a guard against an Arrow crash at
    # thread shutdown), which a contract test reading 2 samples of 80 reaches: not waited here.
    monkeypatch.setattr(
        importlib.import_module("datasets.config"), "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0
    )
    write_corpus(project / "data" / "external" / "corpus")
    if prepared:  # the user ran `prepare` (nothing to prepare): data/processed/<task> exists
        (project / "data" / "processed" / NAME).mkdir(parents=True)
    task = contract.configured(NAME, tmp_path_factory.mktemp("elsewhere"))
    contract.test_samples_can_be_batched(task)
    contract.test_loss_is_a_finite_scalar_and_sums_add_up(task)
    contract.test_initial_weights_depend_only_on_the_seed(task)


@pytest.mark.parametrize("external", ["absent", "without-the-files"])
def test_without_its_external_files_the_contract_says_what_to_copy(
    project: Path, tmp_path_factory: pytest.TempPathFactory, external: str
) -> None:
    folder = project / "data" / "external"
    if external == "without-the-files":  # a fresh clone: the folder and its .gitkeep
        folder.mkdir(parents=True)
        (folder / ".gitkeep").write_bytes(b"")
    with pytest.raises(pytest.fail.Exception) as failed:
        contract.configured(NAME, tmp_path_factory.mktemp("elsewhere"))
    assert str(failed.value) == (
        f"task {NAME}: {folder / 'corpus'}: no parquet files. Files below {folder} stay out "
        "of git: copy the ones this task reads there, as on the machine that trains"
    )
    assert failed.value.__suppress_context__  # pytest prints that line alone, no error under it
