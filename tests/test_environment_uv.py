"""environment=uv for real: `make install` (uv sync), the project's tests and `make lint`.

uv installs everything from PyPI except torch, which pyproject.toml takes from PyTorch's wheel
indexes. The test replaces those indexes by name (UV_INDEX, which wins over pyproject.toml)
with local indexes holding the CPU wheel of torch that the test environment was made from:
no CUDA build is ever downloaded. Other packages come from PyPI through uv's cache. The one
that stands in for the CUDA index is removed once uv.lock is made: an install from a current
lock reads no other build's index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from engines import BIN
from envcases import PRESETS, answers_of, baked, offline, run, torch_index, working_copy

CASE = "uv-grete"
CLEAN_ENV: dict[str, str | None] = {"PYTHONPATH": None, "VIRTUAL_ENV": None}


VARIANT = PRESETS[answers_of(CASE)["cluster"]].get("torch_variant", "cu128")


@pytest.fixture(scope="module")
def cuda_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local index in place of PyTorch's CUDA index (it holds the CPU wheel: only uv's lock
    reads it); a test removes it once the lock is made."""
    folder = tmp_path_factory.mktemp("cuda-index")
    torch_index(folder)
    return folder


@pytest.fixture(scope="module")
def installed(
    template: Path, tmp_path_factory: pytest.TempPathFactory, cuda_index: Path
) -> tuple[Path, dict[str, str | None], float]:
    """The uv bake after `make install TORCH_VARIANT=cpu` (a working copy); its env; seconds."""
    index = torch_index(tmp_path_factory.mktemp("torch-index"))
    project = working_copy(
        baked(CASE, template, tmp_path_factory).project, tmp_path_factory.mktemp("uv")
    )
    env: dict[str, str | None] = {
        **CLEAN_ENV,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",  # uv of the test environment
        "UV_INDEX": f"pytorch-cpu={index} pytorch-{VARIANT}={cuda_index.as_uri()}",
        "UV_PYTHON_DOWNLOADS": "never",  # the Python found here, never a download
        # `make install` registers the Jupyter kernel here, not in this machine's own list.
        "JUPYTER_DATA_DIR": str(tmp_path_factory.mktemp("jupyter")),
    }
    start = time.perf_counter()
    done = run(["make", "install", "TORCH_VARIANT=cpu"], project, env)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(f"uv-grete: make install TORCH_VARIANT=cpu took {seconds:.0f} s")
    return project, env, seconds


def test_install_syncs_the_locked_environment_with_the_chosen_extras(
    installed: tuple[Path, dict[str, str | None], float], cuda_index: Path
) -> None:
    project, env, _ = installed
    shutil.rmtree(cuda_index)  # from here on, the CUDA build's index does not answer
    lock = (project / "uv.lock").read_text("utf-8")
    assert 'name = "torch"' in lock and 'version = "2.13.0+cpu"' in lock
    python = str(project / ".venv" / "bin" / "python")
    probe = (
        "import importlib.util as u, torch; extras = ('wandb', 'mlflow', 'tensorboard');"
        "print(torch.__version__, *(bool(u.find_spec(m)) for m in extras))"
    )
    done = run([python, "-c", probe], project, env)
    assert done.stdout.split() == ["2.13.0+cpu", "True", "False", "False"], done.stderr
    for name in ("pytest", "ruff", "mypy", "codespell", "pre-commit"):  # the dev group
        assert (project / ".venv" / "bin" / name).exists(), name
    assert (project / ".git" / "hooks" / "pre-commit").exists()
    # The Jupyter kernel of the synced environment, under the package's name.
    kernel_json = Path(str(env["JUPYTER_DATA_DIR"])) / "kernels" / project.name / "kernel.json"
    kernel = json.loads(kernel_json.read_text("utf-8"))
    assert kernel["argv"][0] == python and kernel["display_name"] == project.name
    # The lock is current: what CI runs (`uv sync --locked`) succeeds without changes, and
    # without the CUDA build's index, as make install-cpu does.
    again = run(["uv", "sync", "--locked", "--extra", "cpu", "--extra", "wandb"], project, env)
    assert again.returncode == 0, again.stderr[-3000:]
    done = run(["make", "install-cpu"], project, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_lock_made_where_the_cuda_index_does_not_answer_says_so(
    template: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """uv.lock holds both torch builds: making it reads the CUDA index too, and says so."""
    project = working_copy(baked(CASE, template, tmp_path_factory).project, tmp_path)
    cuda = f"http://127.0.0.1:9/whl/{VARIANT}"  # nothing listens on port 9
    env = {
        **CLEAN_ENV,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "UV_INDEX": f"pytorch-cpu={torch_index(tmp_path / 'index')} pytorch-{VARIANT}={cuda}",
        "UV_PYTHON_DOWNLOADS": "never",
    }
    done = run(["make", "install-cpu"], project, env)
    assert done.returncode != 0
    line = next(ln for ln in reversed(done.stderr.splitlines()) if ln.startswith("make install"))
    assert line.startswith("make install: uv sync failed ("), line
    assert f"reads {cuda} (pytorch-{VARIANT}) too; make uv.lock where that index answers" in line
    assert line.endswith(f"UV_INDEX=pytorch-{VARIANT}=<url>"), line
    assert not (project / ".venv").exists() and not (project / "uv.lock").exists()


@pytest.mark.slow
def test_project_tests_pass_in_the_uv_environment(
    installed: tuple[Path, dict[str, str | None], float],
) -> None:
    project, env, _ = installed
    tests = "tests/test_tracking.py tests/test_config.py tests/test_observe.py"
    done = run(["make", "test", f"ARGS=-q -rs -p no:cacheprovider {tests}"], project, env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "the wandb extra is not installed" not in done.stdout  # the W&B tests ran
    assert " passed" in done.stdout.splitlines()[-1]


def test_lint_passes_with_the_lock_committed(
    installed: tuple[Path, dict[str, str | None], float],
) -> None:
    project, env, _ = installed
    run(["git", "add", "uv.lock"], project)  # as the generated README says
    done = run(["make", "lint"], project, env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    for name in ("mypy (types)", "codespell (spelling)", "ruff check"):
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith(name)), "")
        assert line.endswith("Passed"), f"{name}: {line or 'did not run'}"


@pytest.mark.slurm
def test_job_on_local_slurm_runs_in_the_synced_venv_and_tracks_offline(
    installed: tuple[Path, dict[str, str | None], float],
) -> None:
    """One training job of the uv project: common.sh activates .venv; W&B stays offline."""
    from slurm.localslurm import temporary_cluster  # noqa: PLC0415  (only this test needs it)
    from slurm.project import JobProject, require_slurm  # noqa: PLC0415

    require_slurm()
    project, _, _ = installed
    with temporary_cluster("slurm-uv-") as cluster:
        proj = JobProject(project, cluster)
        proj.cli("prepare")
        args = ("train.epochs=1", "run.figures=false", "run.name=uvjob")
        job = proj.sbatch("slurm/train.sbatch", *args)
        info = proj.finished(job)
        log = proj.log(f"{proj.slug}-{job}")
        assert info["JobState"] == "COMPLETED", log
    assert re.search(rf"launch: srun .*python -m {proj.slug} train", log), log
    state = project / "runs" / "uvjob"
    assert json.loads((state / "summary.json").read_text())["status"] == "finished"
    folders = list((state / "wandb").glob("offline-run-*"))  # tracking=wandb, offline
    assert len(folders) == 1, folders


def test_make_wheels_fills_uvs_cache_and_install_runs_from_it_without_a_network(
    installed: tuple[Path, dict[str, str | None], float], tmp_path: Path
) -> None:
    """Last in this file: it takes .venv away and makes it again, offline."""
    project, env, _ = installed
    no_net = offline()
    cache = tmp_path / "uv-cache"
    done = run(["make", "wheels", "TORCH_VARIANT=cpu", f"WHEELS={cache}"], project, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith(f"make wheels: {cache} holds")
    shutil.rmtree(project / ".venv")
    # An empty cache: uv cannot install offline; the environment it began is removed.
    empty = {**env, "WHEELS": str(tmp_path / "empty")}
    done = run([*no_net, "make", "install", "TORCH_VARIANT=cpu"], project, empty)
    assert done.returncode != 0
    line = next(ln for ln in reversed(done.stderr.splitlines()) if ln.startswith("make install"))
    assert line.startswith("make install: uv sync failed ("), line
    assert line.endswith("the folder lacks it: run `make wheels` again where there is internet")
    assert not (project / ".venv").exists()
    done = run(
        [*no_net, "make", "install", "TORCH_VARIANT=cpu"], project, {**env, "WHEELS": str(cache)}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "make install: done, torch 2.13.0+cpu in .venv/" in done.stdout
