"""The command line: quick help, doctor, and prepare + train + evaluate end to end."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import DIGITS, PACKAGE, ROOT, cli_env, example_task, pkg, run_cli

cli = pkg("cli")


def test_help_does_not_import_torch(project: Path) -> None:
    code = (
        f"import sys; from {PACKAGE} import cli; cli.build_parser().format_help(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(project),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "command", ["prepare", "train", "evaluate", "compare", "doctor", "data", "sweep"]
)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_doctor_reports_versions_and_speed(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for needle in ("python", "torch", "slurm", "workers", "matmul"):
        assert needle in out


def test_doctor_flags_a_gpu_job_without_a_visible_gpu(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")
    cfg = pkg("task").load_config(None, ["data.num_workers=100000"])
    warnings = pkg("ops.doctor").run_doctor(cfg, pkg("settings").get_settings(), quick=True)
    assert any("torch sees none" in w for w in warnings)
    assert any("exceeds" in w for w in warnings)


def test_doctor_names_a_library_cache_in_the_home_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = project / "home"
    monkeypatch.setenv("HOME", str(home))
    for var in pkg("settings").CACHE_VARS:
        monkeypatch.setenv(var, "")  # unset for get_settings; undone after the test
    monkeypatch.setenv("HF_HOME", "~/.cache/huggingface")  # the libraries' own default
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / ".cache" / "huggingface" / "datasets"))
    cfg = pkg("task").load_config(None, [])
    warnings = pkg("ops.doctor").run_doctor(cfg, pkg("settings").get_settings(), quick=True)
    in_home = [w for w in warnings if "home directory" in w]
    hf_home = home / ".cache" / "huggingface"
    fix = "set HF_HOME in .env to project or scratch storage (see .env.example)"
    # Named once: the hub and datasets caches below it are not named again.
    assert in_home == [
        f"HF_HOME={hf_home} is in the home directory (small quota, backed up): {fix}"
    ]
    out = capsys.readouterr().out
    assert f"cache    TORCH_HOME={project / 'data' / '.cache' / 'torch'}\n" in out  # default
    assert f"warning: HF_HOME={hf_home} is in the home directory" in out


def test_prepare_train_evaluate_from_the_command_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's first steps: raw digits checked against the manifest, then trained."""
    if not example_task("digits"):
        pytest.skip("the digits example is not part of this project (any more)")
    shutil.copytree(ROOT / "configs", project / "configs")
    (project / "data" / "raw").mkdir(parents=True)
    shutil.copy2(DIGITS, project / "data" / "raw")
    assert cli.main(["data", "freeze"]) == 0  # this scratch project's own manifest
    assert cli.main(["prepare", "task.name=digits"]) == 0
    train = run_cli(
        "train",
        "task.name=digits",
        "run.name=cli",
        "train.epochs=4",
        "run.figures=false",
        project=project,
    )
    assert train.returncode == 0, train.stderr
    assert "where the time went" in train.stdout
    assert cli.main(["evaluate"]) == 0
    evaluation = json.loads((project / "runs" / "cli" / "evaluation.json").read_text())
    assert evaluation["accuracy"] > 0.8

    # A changed raw file stops prepare with one line and exit 1, before anything is read.
    raw = project / "data" / "raw" / DIGITS.name
    raw.chmod(0o644)
    content = bytearray(raw.read_bytes())
    content[100] ^= 0xFF
    raw.write_bytes(bytes(content))
    assert cli.main(["prepare", "task.name=digits"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: raw data")
    assert err.count("\n") == 1
