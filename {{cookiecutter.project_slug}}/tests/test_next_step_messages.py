"""Messages that tell a newcomer the next step: each names the command or file to use."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PACKAGE, ROOT, blobs, example_task, pkg

cli = pkg("cli")
config = pkg("config")


def test_an_option_gets_the_setting_it_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--epochs", "3"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --epochs" in err
    assert f"`{PACKAGE} train train.epochs=3`" in err
    with pytest.raises(SystemExit):
        cli.main(["prepare", "--val-fraction=0.2"])
    assert f"`{PACKAGE} prepare data.val_fraction=0.2`" in capsys.readouterr().err


def test_a_typo_in_a_config_file_names_the_file(tmp_path: Path) -> None:
    train = tmp_path / "train.toml"
    train.write_text('[task]\nname = "mine"\n\n[run]\nkeep_chekpoints = 2\n', encoding="utf-8")
    with pytest.raises(config.ConfigError, match=r"keep_chekpoints") as err:
        pkg("task").load_config(train)
    assert str(err.value).startswith(f"{train}: unknown config key 'run.keep_chekpoints'")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    train.write_text('[task]\nname = "mine"\n', encoding="utf-8")
    (tasks / "mine.toml").write_text("[train]\nepochs = 'three'\n", encoding="utf-8")
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, task_dir=tasks)
    assert str(err.value).startswith(f"{tasks / 'mine.toml'}: train.epochs: expected int")


def test_a_typo_in_a_task_table_names_the_file(tmp_path: Path) -> None:
    """`[task]` settings are checked once the task is known; the error still names the file."""
    train, tasks = tmp_path / "train.toml", tmp_path / "tasks"
    tasks.mkdir()
    train.write_text('[task]\nname = "toy_tasks.blobs"\nfeature = 8\n', encoding="utf-8")
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, task_dir=tasks)
    message = str(err.value)
    assert message.startswith(f"{train}: unknown config key 'task.feature'; task 'toy_tasks.blobs'")
    assert "'features'" in message and "\n" not in message
    train.write_text('[task]\nname = "toy_tasks.blobs"\n', encoding="utf-8")
    (tasks / "toy_tasks.blobs.toml").write_text('[task]\nn = "many"\n', encoding="utf-8")
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, task_dir=tasks)
    task_file = tasks / "toy_tasks.blobs.toml"
    assert str(err.value) == f"{task_file}: task.n: expected int, got str 'many'"
    # A later layer that sets the key again takes the blame: here an override, which has no file.
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, ["task.n=many"], task_dir=tasks)
    assert str(err.value) == "task.n: expected int, got 'many'"
    train.write_text('[task]\nname = "digts"\n', encoding="utf-8")
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, task_dir=tasks)
    assert str(err.value).startswith(f"{train}: task.name: no task 'digts'; tasks here: ")
    with pytest.raises(config.ConfigError) as err:
        pkg("task").load_config(train, ["task.name=digts"], task_dir=tasks)
    assert str(err.value).startswith("task.name: no task 'digts'")


def test_evaluate_an_unknown_run_lists_the_runs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["evaluate", "--run", "nosuch"]) == 1
    assert capsys.readouterr().err.endswith("; runs: none yet: train first\n")
    for name in ("baseline", "wide"):
        (project / "runs" / name / "checkpoints").mkdir(parents=True)
    assert cli.main(["evaluate", "--run", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: --run nosuch: no such run in {project / 'runs'}; runs: baseline, wide\n"


def test_train_before_prepare_names_the_prepare_command(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not example_task("regression"):
        pytest.skip("the regression example is not part of this project (any more)")
    shutil.copytree(ROOT / "configs", project / "configs")
    args = ["task.name=regression", "data.verify_raw=false"]
    assert cli.main(["train", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"`{PACKAGE} prepare task.name=regression data.verify_raw=false`" in err


def test_submit_without_slurm_says_so_in_one_line(tmp_path: Path) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), "submit", "ALLOW_DIRTY=1"],
        env={"PATH": str(tmp_path)},  # no sbatch on it
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    first = done.stderr.splitlines()[0]
    assert first.startswith("make submit: no Slurm here (sbatch: command not found): submit on")
    assert "or train here with make train" in first


@pytest.mark.parametrize("label", ["cpu", "cu126"])
def test_install_ends_by_checking_the_torch_in_the_environment(
    label: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make install` checks torch last: a package that pulled in another build is named."""
    spec = importlib.util.spec_from_file_location("install_tool", ROOT / "tools" / "install.py")
    assert spec and spec.loader
    install = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(install)
    info = tmp_path / f"torch-2.9.0+{label}.dist-info"  # what pip left: its version data only
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0+{label}\n", encoding="utf-8"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    if label == "cpu":
        assert install.check_installed(sys.executable, "cpu") == "2.9.0+cpu"
        return
    with pytest.raises(install.InstallError) as refused:
        install.check_installed(sys.executable, "cpu")
    assert str(refused.value).startswith(
        "the environment holds torch 2.9.0+cu126, not the cpu build: a package required"
    )


@pytest.mark.parametrize("setting", ["train.batch_size=4096", "train.grad_accum_steps=512"])
def test_batches_larger_than_the_data_name_what_fits(project: Path, setting: str) -> None:
    """The message names a value that fits; the run with it trains."""
    common = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "run.name=fit"]
    trainer = pkg("engine.loop.trainer")
    task = blobs(*common, "train.batch_size=16", setting)
    with pytest.raises(config.ConfigError) as refused:
        trainer.train(task.cfg, task)
    message = str(refused.value)
    assert "training samples; train." in message and "\n" not in message
    fits = message.rpartition("; ")[2].partition(" ")[0]  # e.g. train.grad_accum_steps=3
    assert fits.partition("=")[0] == setting.partition("=")[0], message
    task = blobs(*common, "train.batch_size=16", setting, fits)
    assert trainer.train(task.cfg, task).summary["status"] == "finished"
