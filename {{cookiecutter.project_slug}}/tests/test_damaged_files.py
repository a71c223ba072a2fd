"""Files a crash or a careless hand can damage, read by every command that reads them.

Hypothesis cuts each file short, flips one of its bits, puts bytes into it that are not
UTF-8, or puts a value of the wrong type where a number was. Whatever the damage, the command
either reads the file as it now stands or refuses it in one line that names the file; it
never ends in a traceback and never changes a file on disk. The examples are derandomized, so
a run here is the run in CI.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import DEV_ONLY, blobs, pkg

pytest.importorskip("hypothesis", reason=DEV_ONLY)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

cli, trainer = pkg("cli"), pkg("engine.loop.trainer")

# Each example resets the files it damages, so the function-scoped folders can be shared.
EXAMPLES = settings(
    max_examples=30,
    deadline=None,  # a shared, loaded machine
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def damage(original: bytes) -> st.SearchStrategy[bytes]:
    """The file cut short, one bit flipped, foreign bytes put in, or a number retyped."""
    end = len(original)
    numbers = [m.span() for m in NUMBER.finditer(original)] or [(0, 0)]
    cut = st.integers(0, end - 1).map(lambda i: original[:i])
    flip = st.tuples(st.integers(0, end - 1), st.integers(0, 7)).map(
        lambda at: original[: at[0]] + bytes([original[at[0]] ^ 1 << at[1]]) + original[at[0] + 1 :]
    )
    foreign = st.tuples(st.integers(0, end), st.sampled_from([b"\xff", b"\xe9", b"\x00"])).map(
        lambda at: original[: at[0]] + at[1] + original[at[0] :]
    )
    retyped = st.tuples(
        st.sampled_from(numbers), st.sampled_from([b'"x"', b"[]", b"true", b"nan", b""])
    ).map(lambda at: original[: at[0][0]] + at[1] + original[at[0][1] :])
    return st.one_of(cut, flip, foreign, retyped)


def files_below(root: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return err.splitlines()


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's folder (config.toml, metrics.csv, summary.json, checkpoints)."""
    root = tmp_path_factory.mktemp("one-run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROJECT_ROOT", str(root))
        for var in ("RUNS_DIR", "RUN_NAME", "PACKED_RUNS", "SLURM_JOB_ID"):
            mp.delenv(var, raising=False)
        overrides = ["run.progress=log", "run.figures=false", "data.verify_raw=false"]
        task = blobs(*overrides, "train.epochs=1", "run.name=kept", features=2, classes=3)
        trainer.train(task.cfg, task)
    return root / "runs" / "kept"


@pytest.mark.parametrize("name", ["config.toml", "metrics.csv", "summary.json"])
@EXAMPLES
@given(data=st.data())
def test_compare_reads_a_damaged_run_or_names_its_file(
    name: str,
    one_run: Path,
    project: Path,
    capsys: pytest.CaptureFixture[str],
    data: st.DataObject,
) -> None:
    """`compare` over two runs, one of them with `name` damaged: the other always prints."""
    runs = project / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    for run in ("good", "hurt"):
        shutil.copytree(one_run, runs / run)
    path = runs / "hurt" / name
    path.write_bytes(data.draw(damage(path.read_bytes()), label=name))
    before = files_below(runs)
    capsys.readouterr()
    code = cli.main(["compare", "--no-figure"])
    out, err = capsys.readouterr()
    lines = error_lines(err)
    assert (code, len(lines)) in {(0, 0), (1, 1)}, err
    if code:
        assert lines[0].startswith(f"warning: run hurt is damaged: {path}: ")
    assert any(line.split()[:1] == ["good"] for line in out.splitlines()), out
    assert files_below(runs) == before


SPACE = """
[sweep]
name = "lr"
concurrency = 4
[space]
train.lr = [0.001, 0.003]
model.hidden = {range = [16, 48, 16]}
[fixed]
task.name = "toy_tasks.blobs"
train.epochs = 2
"""


@EXAMPLES
@given(text=damage(SPACE.encode()))
def test_a_damaged_sweep_space_is_read_or_refused_in_one_line(
    project: Path, capsys: pytest.CaptureFixture[str], text: bytes
) -> None:
    path = project / "sweep.toml"
    path.write_bytes(text)
    before = files_below(project)
    capsys.readouterr()
    code = cli.main(["sweep", str(path), "--dry-run"])
    lines = error_lines(capsys.readouterr().err)
    assert code in {0, 2}
    if code:
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert "sweep" in lines[0]  # the file, or the sweep.* or space key in it
    assert files_below(project) == before


STUDY = """
[sweep]
name = "opt"
method = "optuna"
trials = 2
concurrency = 1
[space]
train.lr = {log_uniform = [1e-4, 1e-1]}
[[enqueue]]
train.lr = 0.01
[fixed]
task.name = "toy_tasks.blobs"
"""


@pytest.fixture
def study(project: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An Optuna sweep submitted once (a fake sbatch): its space file and its journal."""
    pytest.importorskip("optuna", reason="the sweep extra (optuna) is not installed")
    tools = project / "bin"
    tools.mkdir()
    (tools / "sbatch").write_text("#!/bin/sh\necho 41\n", encoding="utf-8")
    (tools / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    space = project / "sweep.toml"
    space.write_text(STUDY, encoding="utf-8")
    assert cli.main(["sweep", str(space)]) == 0
    return space, project / "runs" / ".sweeps" / "opt" / "optuna.journal"


@EXAMPLES
@given(data=st.data())
def test_a_damaged_journal_is_read_or_refused_in_one_line(
    study: tuple[Path, Path], capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    space, journal = study
    whole = journal.read_bytes()
    journal.write_bytes(data.draw(damage(whole), label="journal"))
    before = files_below(space.parent)
    capsys.readouterr()
    code = cli.main(["sweep", str(space)])
    lines = error_lines(capsys.readouterr().err)
    assert code in {0, 2}
    if code:
        assert len(lines) == 1 and lines[0].startswith(f"error: {journal}")
        assert files_below(space.parent) == before
    journal.write_bytes(whole)


@EXAMPLES
@given(data=st.data())
def test_a_damaged_made_with_record_is_read_or_refused_in_one_line(
    project: Path, data: st.DataObject
) -> None:
    """What processed data was made with, damaged: accepted as it reads, or one line."""
    made_with, folder = pkg("data.made_with"), project / "processed"
    folder.mkdir(exist_ok=True)
    values = {"tokenizer": "9f2c" * 16, "tokenizer_from": "models/tiny", "context": 64}
    made_with.write_made_with(folder, {**values, "stride": 32, "fraction": 0.9})
    path = folder / made_with.MADE_WITH
    path.write_bytes(data.draw(damage(path.read_bytes()), label="record"))
    before = files_below(folder)
    try:
        made_with.check_made_with(folder, "lm", values)
    except pkg("errors").DataError as err:
        message = str(err)
        assert "\n" not in message
        assert message.startswith((f"{path}: unreadable", "task lm: its processed data")), message
    assert files_below(folder) == before


@EXAMPLES
@given(data=st.data())
def test_a_damaged_export_record_is_replaced_or_refused_in_one_line(
    one_run: Path, project: Path, data: st.DataObject
) -> None:
    """A second `export` over a first whose record is damaged: what the user added stays."""
    export, settings = pkg("ops.export"), pkg("settings").get_settings()
    run_dir = project / "runs" / "kept"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(one_run, run_dir)
    out = export.export_run(run_dir, run_dir / "export", settings)
    (out / "notes.md").write_text("evaluated on the new set\n", encoding="utf-8")
    record = out / export.RECORD
    record.write_bytes(data.draw(damage(record.read_bytes()), label="record"))
    before = files_below(out)
    try:
        export.export_run(run_dir, out, settings)
    except pkg("errors").ConfigError as err:
        assert "\n" not in str(err) and str(out) in str(err), err
        assert files_below(out) == before
    assert (out / "notes.md").read_text(encoding="utf-8") == "evaluated on the new set\n"
