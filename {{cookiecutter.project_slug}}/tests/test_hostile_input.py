"""Careless and hostile input to every command: one line on stderr, a documented exit code.

Each rejection also leaves the project as it was: nothing outside data/raw and the run
directory ever changes, and a rejected command changes nothing at all.
"""

import os
import stat
from pathlib import Path

import pytest

from conftest import pkg, run_cli

cli = pkg("cli")
names = pkg("engine.names")
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path below root (and its siblings' names) with size, mode and mtime."""
    found = {}
    for path in [*root.parent.iterdir(), *root.rglob("*")]:
        st = path.lstat()
        found[str(path)] = (st.st_size, st.st_mode, st.st_mtime_ns)
    return found


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    "name", ["../x", "..", ".", "/srv/abs", "a/b", ".hidden", "-x", "x" * 101, "a b", "ü"]
)
def test_run_names_outside_runs_are_refused(
    name: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(project)
    assert cli.main(["train", f"run.name={name}"]) == 2
    assert "run.name" in one_error_line(capsys.readouterr().err)
    assert snapshot(project) == before


def test_run_name_from_the_environment_is_checked_too(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RUN_NAME", "../../x")
    before = snapshot(project)
    assert cli.main(["train"]) == 2
    assert "RUN_NAME '../../x'" in one_error_line(capsys.readouterr().err)
    assert snapshot(project) == before


def test_the_trainer_checks_the_run_name_too() -> None:
    """Code that calls the trainer without the command line gets the same rule."""
    cfg = pkg("task").load_config(None, [])
    with pytest.raises(pkg("errors").ConfigError, match="RUN_NAME '/abs'"):
        pkg("engine.loop.trainer").run_name(cfg, {"RUN_NAME": "/abs"})


def test_evaluate_refuses_a_run_outside_runs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["evaluate", "--run", "../.."]) == 2
    assert "--run '../..'" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("name", ["exp1", "lr=0.1_bs=64", "20260101-120000", "123_4", "a.b+c"])
def test_ordinary_run_names_are_accepted(name: str) -> None:
    assert names.check_run_name(name, "run.name") == name


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.hidden=100000000000", "model.hidden"),
        ("run.seed=12345678901234567890", "run.seed"),
        ("train.epochs=99999999999999999999", "train.epochs"),
        ("train.batch_size=1000000000000", "train.batch_size"),
        ("model.dropout=1.5", "model.dropout"),
    ],
)
def test_absurd_values_are_refused_by_name(
    override: str, key: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(project)
    assert cli.main(["train", override]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert key in line and "at most" in line
    assert snapshot(project) == before


def test_config_that_is_a_folder_or_not_text(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "folder.toml").mkdir()
    (project / "latin1.toml").write_bytes(b"[run]\nname = 'caf\xe9'\n")
    for path in ("folder.toml", "latin1.toml"):
        assert cli.main(["prepare", "--config", str(project / path)]) == 2
        assert f"{project / path}: cannot be read" in one_error_line(capsys.readouterr().err)


def test_a_dotenv_that_is_not_utf8_gives_one_line(project: Path) -> None:
    (project / ".env").write_bytes(b"DATA_DIR=/d\xe9j\xe0\n")
    done = run_cli("doctor", "--quick", project=project)
    assert done.returncode == 1
    assert ".env: not UTF-8 text" in one_error_line(done.stderr)


@pytest.mark.parametrize("variable", ["RUNS_DIR", "DATA_DIR"])
def test_a_path_variable_naming_a_file_gives_one_line(variable: str, project: Path) -> None:
    (project / "plain.txt").write_text("x\n")
    done = run_cli("evaluate", project=project, env={variable: str(project / "plain.txt")})
    assert done.returncode == 1
    assert f"{variable} {project / 'plain.txt'}: is a file" in one_error_line(done.stderr)


def test_a_folder_named_like_a_checkpoint_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "step-000000005.pt").mkdir()
    assert pkg("engine.state.checkpoint").list_checkpoints(tmp_path) == []


def raw_project(project: Path) -> Path:
    raw = project / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "a.csv").write_text("1,2\n")
    (raw / "sub").mkdir()
    (raw / "sub" / "b.csv").write_text("3,4\n")
    return raw


@pytest.mark.parametrize("kind", ["folder", "latin1"])
def test_a_manifest_that_cannot_be_read_gives_one_line(
    kind: str, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw_project(project)
    manifest = project / "data" / "raw.manifest.tsv"
    if kind == "folder":
        manifest.mkdir()
    else:
        manifest.write_bytes(b"path\tsize\tmode\tsha256\n\xe9\t1\t0444\t" + b"0" * 64 + b"\n")
    assert cli.main(["data", "verify"]) == 1
    assert "manifest" in one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(AS_ROOT, reason="root reads any file")
def test_unreadable_raw_files_and_folders_give_one_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = raw_project(project)
    (raw / "a.csv").chmod(0)
    assert cli.main(["data", "freeze"]) == 1
    assert "cannot be read" in one_error_line(capsys.readouterr().err)
    (raw / "a.csv").chmod(0o644)
    (raw / "sub").chmod(0)
    try:
        assert cli.main(["data", "freeze"]) == 1
        assert "cannot be read" in one_error_line(capsys.readouterr().err)
    finally:
        (raw / "sub").chmod(0o755)


def test_freeze_update_is_all_or_nothing(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest that cannot be written leaves every raw file's mode as it was."""
    raw = raw_project(project)
    (project / "blocker").write_text("a file where the manifest's folder should be\n")
    before = snapshot(project)
    code = cli.main(
        ["data", "freeze", "--update", "--manifest", str(project / "blocker" / "m.tsv")]
    )
    assert code == 1
    assert "cannot be written" in one_error_line(capsys.readouterr().err)
    assert snapshot(project) == before
    assert (raw / "a.csv").stat().st_mode & stat.S_IWUSR


def test_freeze_never_changes_files_outside_data_raw(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    raw = raw_project(project)
    outside = tmp_path_factory.mktemp("shared") / "shared.csv"
    outside.write_text("5,6\n")
    outside.chmod(0o644)
    (raw / "link.csv").symlink_to(outside)
    assert cli.main(["data", "freeze"]) == 0
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    assert not (raw / "a.csv").stat().st_mode & stat.S_IWUSR
    assert "link.csv" in (project / "data" / "raw.manifest.tsv").read_text()
    assert cli.main(["data", "verify"]) == 0


def test_manifest_paths_written_with_dot_slash_name_the_file(project: Path) -> None:
    raw_project(project)
    assert cli.main(["data", "freeze"]) == 0
    manifest = project / "data" / "raw.manifest.tsv"
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0]] + [f"./{line}" for line in lines[1:]]) + "\n")
    assert cli.main(["data", "verify"]) == 0


def test_a_raw_file_gone_while_hashing_gives_one_line(tmp_path: Path) -> None:
    """Unreadable raw files (also as root, who reads everything): a RawDataError, no traceback."""
    with pytest.raises(pkg("data.manifest").RawDataError, match="cannot be read"):
        pkg("data.rawdata").sha256_file(tmp_path / "vanished.csv")
