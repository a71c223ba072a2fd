"""Damaged data never trains silently and never ends in a traceback, whatever reads it.

Each kind of stream of `toy_tasks.faults` (and a map-style data set) reads files from
DATA_DIR/external, one of which arrived damaged: cut short, at a tar member's boundary too, or
a bit flipped in a checksummed parquet page. On 1 process with 1 DataLoader worker (the
test's own: `cli_here`) and on 2 processes with 2 workers each (started as srun starts them:
one process per rank, no torchrun), the run stops with exit 6 and one line that names the
file, the worker and the process and the checkpoint of its last good step; no traceback
reaches the terminal (it is in runs/<name>/errors.log), and the damaged file is not taken
into the source record. Once the file is repaired, the run continues from that checkpoint to
the same weights as a run that never met the damage.
"""

import importlib.util
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import CliHere, assert_identical, final_weights, pkg, run_ranks
from toy_tasks import faults

NEEDS_DATASETS = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None, reason="the datasets extra is not installed"
)
ARGS = [
    "run.progress=log",
    "run.figures=false",
    "data.verify_raw=false",
    "task.name=toy_tasks.faults",
    "train.batch_size=8",
    "train.schedule=constant",
    "train.epochs=1",
]
LINE = re.compile(
    r"error: reading the training data failed: (?P<cause>.+), in DataLoader worker \d of "
    r"process \d(?: \(and 1 more process\(es\)\))?; checkpoint at step (?P<step>\d+) written, "
    r"exit 6 \(traceback in (?P<log>\S+)\): repair or replace the file, then start "
    r"run.name=(?P<run>\S+) again to continue from there"
)


# On 1 process the quick set (`make test`) stops one kind for each way a damaged file is
# found and named: a task's own reader (plain: the file it opened last), the tar reader (it
# names the file), parquet (hf: the files read are checked) and map-style data; the kinds
# that differ from these only in how their position is kept (stateful, buffered, hf-own) run
# with the slow tests (`make test-all`, CI). On 2 processes, what differs is how the
# processes agree to stop: a stream's vote (tar) and map-style data's (map), slow too.
QUICK_KINDS = ("plain", "tar", "hf", "map")
ON_TWO = ("tar", "map")


def layouts() -> list[object]:
    """Every kind on 1 process, the two ways of agreeing on 2; hf skips without datasets."""
    return [
        pytest.param(
            kind,
            processes,
            marks=[
                *([NEEDS_DATASETS] if kind.startswith("hf") else []),
                *([] if processes == 1 and kind in QUICK_KINDS else [pytest.mark.slow]),
            ],
            id=f"{kind}-{processes}",
        )
        for processes, kinds in ((1, faults.KINDS), (2, ON_TWO))
        for kind in kinds
    ]


Train = Callable[..., list[subprocess.CompletedProcess[str]]]


@pytest.fixture
def train(project: Path, cli_here: CliHere) -> Train:
    """`train` with `args` on 1 process (1 worker, in this one) or 2 (2 workers each)."""

    def run(processes: int, *args: str) -> list[subprocess.CompletedProcess[str]]:
        workers = f"data.num_workers={processes}"
        if processes == 1:
            return [cli_here("train", *ARGS, workers, *args)]
        return run_ranks(project, "train", *ARGS, workers, *args)

    return run


def stopped_on_damage(outs: list[subprocess.CompletedProcess[str]], damaged: Path) -> int:
    """The checkpoint's step, after checking that the run said the damage as it must."""
    said = "".join(out.stdout + out.stderr for out in outs)
    assert [out.returncode for out in outs] == [6] * len(outs), said[-4000:]
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if line.startswith(("error", "warning"))]
    assert len(lines) == 1, said  # rank 0 says it; another rank says nothing
    found = LINE.fullmatch(lines[0])
    assert found, lines[0]
    assert str(damaged) in found["cause"], lines[0]
    assert "Traceback" in Path(found["log"]).read_text(encoding="utf-8")
    return int(found["step"])


def damaged_run(
    project: Path, train: Train, kind: str, processes: int, *args: str
) -> tuple[int, Path, bytes]:
    """Write a kind's files, damage one, train: the checkpoint's step, the file, its content."""
    data_dir = project / "data"
    faults.write_files(data_dir, kind)
    whole = sorted(faults.folder(data_dir, kind).iterdir())[-1].read_bytes()
    damaged = faults.damage(data_dir, kind).resolve()
    outs = train(processes, f"task.kind={kind}", *args)
    return stopped_on_damage(outs, damaged), damaged, whole


@pytest.mark.parametrize(("kind", "processes"), layouts())
def test_a_damaged_file_stops_the_run_in_one_line_with_its_last_good_step(
    project: Path, train: Train, kind: str, processes: int
) -> None:
    step, _, _ = damaged_run(project, train, kind, processes, "run.name=r")
    assert step > 0  # the damage lies two thirds into its file
    saved = pkg("engine.state.checkpoint").list_checkpoints(project / "runs" / "r" / "checkpoints")
    assert saved[-1][0] == step
    assert not (project / "data" / "sources.manifest.tsv").exists()  # nothing taken as good


@pytest.mark.parametrize(
    ("kind", "processes"),
    [("map", 1), ("tar", 1), pytest.param("tar", 2, marks=pytest.mark.slow)],
)
def test_a_damaged_validation_file_stops_the_run_after_its_step(
    project: Path, train: Train, kind: str, processes: int
) -> None:
    """Validation at the epoch's end fails: every process stops, the step done is kept."""
    step, _, _ = damaged_run(project, train, kind, processes, "task.split=val", "run.name=v")
    assert step == faults.FILES * faults.ROWS // (8 * processes)  # the whole epoch's steps


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "processes"),
    [("tar", 2), ("map", 2), pytest.param("hf", 1, marks=NEEDS_DATASETS)],
)
def test_after_the_repair_the_run_ends_where_an_undamaged_one_does(
    project: Path, train: Train, kind: str, processes: int
) -> None:
    """Exact: every sample used before the stop was read whole, none of the damaged part."""
    step, damaged, whole = damaged_run(project, train, kind, processes, "run.name=cut")
    damaged.write_bytes(whole)  # repaired: the copy done again
    resumed = train(processes, f"task.kind={kind}", "run.name=cut")
    assert [out.returncode for out in resumed] == [0] * processes, resumed[0].stdout[-3000:]
    assert f"resumed from step {step} " in resumed[0].stdout
    undamaged = train(processes, f"task.kind={kind}", "run.name=whole")
    assert [out.returncode for out in undamaged] == [0] * processes, undamaged[0].stdout[-3000:]
    runs = project / "runs"
    assert_identical(final_weights(runs / "whole"), final_weights(runs / "cut"))
