"""`make install` and `make wheels` (tools/install.py) as cluster sites configure pip.

Local wheel indexes stand in for PyTorch's CPU index and a site mirror named as an extra
index: the mirror offers a newer CUDA build (``2.14.1+cu130``), which pip on its own prefers.
Fake torch wheels are tiny, so nothing large is downloaded. The tool must take the variant's
build from its own index, refuse another build before installing anything, keep an installed
torch that fits, remove an environment it made when a step fails, leave an existing one
working, and end every failure in one line that names the way out. A tiny project (the tool
beside a pyproject.toml without dependencies) runs the whole route in seconds; the last test
runs `make wheels-cpu` and then `make install-cpu` without a network on a real bake.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from engines import ROOT, module_at
from envcases import baked, offline, run, torch_index, working_copy

TOOL = ROOT / "{{cookiecutter.project_slug}}" / "tools" / "install.py"


tool = module_at(TOOL, "install_tool")  # standard library only: it imports anywhere


def fake_wheel(folder: Path, version: str) -> None:
    """A wheel named torch `version` that installs an empty package; a simple index for it."""
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    (folder / "torch").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "torch" / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in (folder / "torch").glob("*.whl"))
    (folder / "torch" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh environment's Python (with pip), as `make install` has made it."""
    env = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    return str(env / "bin" / "python")


def site(mirror: Path) -> dict[str, str]:
    """pip configured with `mirror` as an extra index. This machine's own find-links folder
    (its real torch wheel) is replaced by an empty one: pip ignores an empty value."""
    (mirror.parent / "no-links").mkdir(exist_ok=True)
    links = str(mirror.parent / "no-links")
    return {**os.environ, "PIP_EXTRA_INDEX_URL": mirror.as_uri(), "PIP_FIND_LINKS": links}


def test_the_variant_comes_from_its_index_whatever_pip_is_configured_with(
    python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, mirror = tmp_path / "cpu", tmp_path / "mirror"
    fake_wheel(cpu, "2.13.0+cpu")
    fake_wheel(mirror, "2.14.1+cu130")
    for key, value in site(mirror).items():
        monkeypatch.setenv(key, value)
    # What pip does on its own with such a configuration: the newer CUDA build.
    plain = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "torch>=2.4,<3"]
    done = subprocess.run(
        [*plain, "--index-url", cpu.as_uri()], capture_output=True, text=True, check=False
    )
    assert "Would install torch-2.14.1+cu130" in done.stdout, done.stdout + done.stderr

    found = {"TORCH_INDEX": cpu.as_uri()}
    version = tool.torch_choice(python, "cpu", found)
    args, env = tool.torch_sources("cpu", found)
    assert (version, args) == ("2.13.0+cpu", ["--index-url", cpu.as_uri()])
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *args, "torch==" + version],
                   env=env, check=True)  # fmt: skip
    assert tool.installed_torch(python) == "2.13.0+cpu"
    # Installed and the variant's: kept (no download); the check still sees the index.
    assert tool.plan_torch(python, "cpu", found) is None
    assert tool.torch_choice(python, "cpu", found) == "2.13.0+cpu"
    # Another variant is not kept: the check runs again, and this index has no cu126 build.
    with pytest.raises(tool.InstallError, match="not the cu126 build"):
        tool.plan_torch(python, "cu126", found)


def test_an_index_that_offers_another_build_is_refused_before_anything_is_installed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = tmp_path_factory.mktemp("refused") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = str(env / "bin" / "python")
    wrong, mirror = tmp_path / "wrong", tmp_path / "mirror"
    fake_wheel(wrong, "2.14.1+cu130")  # a "CPU mirror" that holds a CUDA build
    fake_wheel(mirror, "2.12.0+cu126")
    for key, value in site(mirror).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(tool.InstallError) as refused:
        tool.torch_choice(python, "cpu", {"TORCH_INDEX": wrong.as_uri()})
    line = str(refused.value)
    assert line.startswith("pip would take torch 2.14.1+cu130 (file://"), line
    assert f"not the cpu build of --index-url {wrong.as_uri()}; nothing was installed" in line
    assert "TORCH_INDEX=<url>" in line
    assert tool.installed_torch(python) == "none"
    # the same index is right for its variant
    assert tool.torch_choice(python, "cu130", {"TORCH_INDEX": wrong.as_uri()}) == "2.14.1+cu130"


def test_an_index_that_does_not_answer_is_named_with_the_way_out(
    python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # not this machine's torch wheel
    found = {"TORCH_INDEX": "http://127.0.0.1:9/whl/cpu"}  # nothing listens on port 9
    with pytest.raises(tool.InstallError) as refused:
        tool.torch_choice(python, "cpu", found)
    line = str(refused.value)
    assert line.startswith("pip finds no torch>=2.4,<3 at --index-url http://127.0.0.1:9/whl/cpu")
    assert "(the index did not answer); where this machine has no internet, name a mirror" in line


@pytest.mark.parametrize(
    ("version", "variant", "platform", "fits"),
    [
        ("2.13.0+cpu", "cpu", "linux", True),
        ("2.13.0", "cpu", "darwin", True),  # macOS wheels carry no label and no CUDA
        ("2.13.0", "cpu", "linux", False),  # PyPI's Linux wheel: a CUDA build
        ("2.13.0+cu126", "cu126", "linux", True),
        ("2.13.0+cu126", "cu128", "linux", False),
    ],
)
def test_which_versions_are_the_variant(
    version: str, variant: str, platform: str, fits: bool
) -> None:
    assert tool.fits(version, variant, platform) is fits


@pytest.mark.parametrize(
    ("version", "inside"),
    [("2.4.0+cpu", True), ("2.13.0", True), ("2.3.1", False), ("3.0.0", False)],
)
def test_the_projects_torch_range(version: str, inside: bool) -> None:
    assert tool.in_range(version) is inside


def test_settings_come_from_the_environment_else_from_dotenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text(
        "# a site's settings\n"
        "export PIP_INDEX_URL='https://pypi.example.org/simple'\n"
        "TORCH_INDEX=https://torch.example.org/whl/cu126  # its mirror\n"
        'WHEELS="shared wheels"\n'
        "DATA_DIR=/elsewhere\n",
        encoding="utf-8",
    )
    for key in tool.SETTINGS:
        monkeypatch.delenv(key, raising=False)
    assert tool.settings(tmp_path) == {
        "PIP_INDEX_URL": "https://pypi.example.org/simple",
        "TORCH_INDEX": "https://torch.example.org/whl/cu126",
        "WHEELS": str(tmp_path / "shared wheels"),  # relative to the project
    }
    monkeypatch.setenv("TORCH_INDEX", "https://other.example.org/cu126")
    assert tool.settings(tmp_path)["TORCH_INDEX"] == "https://other.example.org/cu126"
    assert tool.settings(tmp_path / "none") == {"TORCH_INDEX": "https://other.example.org/cu126"}


# --- the whole route on a tiny project ---------------------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel folder as `make wheels` leaves it for the tiny project: pip, the build backend
    (from this machine's package index or its pip cache) and a fake CPU torch."""
    folder = tmp_path_factory.mktemp("wheels")
    get = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", str(folder)]
    subprocess.run([*get, "pip>=25.1", "setuptools>=77"], check=True)
    fake_wheel(folder / "fake", "2.13.0+cpu")
    shutil.move(next((folder / "fake" / "torch").glob("*.whl")), folder)
    return folder


def tiny(tmp_path: Path, requires: str = '"torch>=2.4,<3"') -> Path:
    """A project of one module whose only dependency is torch, with the install tool."""
    project = tmp_path / "tiny"
    (project / "tools").mkdir(parents=True)
    shutil.copy(TOOL, project / "tools" / "install.py")
    (project / "tiny.py").write_text("", encoding="utf-8")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "tiny"\nversion = "0.1"\ndependencies = [{requires}]\n'
        '[dependency-groups]\ndev = []\n[tool.setuptools]\npy-modules = ["tiny"]\n',
        encoding="utf-8",
    )
    return project


def install_tiny(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`make install`'s command for the venv route in the tiny project."""
    command = [sys.executable, "tools/install.py", "venv", "--variant", "cpu", *args]
    return run(command, project, {"PIP_FIND_LINKS": str(project / "no-links"), **env})


def test_an_offline_install_from_wheels_then_a_failed_one_leaves_it_working(
    tmp_path: Path, wheels: Path
) -> None:
    project = tiny(tmp_path)
    (project / ".env").write_text(f"WHEELS={wheels}\n", encoding="utf-8")
    done = install_tiny(project, PIP_INDEX_URL="http://127.0.0.1:9/nothing-listens-here")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.splitlines()[-1] == "make install: done, torch 2.13.0+cpu in .venv/"
    assert f"--no-index --find-links {wheels}" in done.stdout
    python = str(project / ".venv" / "bin" / "python")
    # A dependency the folder lacks: pip resolves before it installs, nothing changes.
    project_toml = project / "pyproject.toml"
    project_toml.write_text(
        project_toml.read_text("utf-8").replace('"torch>=2.4,<3"', '"torch>=2.4,<3", "absent-pkg"')
    )
    done = install_tiny(project)
    assert done.returncode == 1
    assert "torch 2.13.0+cpu (cpu) is installed: kept" in done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith("make install: installing the project failed (ERROR: "), line
    assert "absent-pkg" in line
    assert line.endswith("the folder lacks it: run `make wheels` again where there is internet")
    assert tool.installed_torch(python) == "2.13.0+cpu"
    assert run([python, "-c", "import tiny"], project).returncode == 0


def test_a_refused_torch_removes_the_environment_it_made(
    tmp_path: Path, wheels: Path, python: str
) -> None:
    project = tiny(tmp_path)
    cuda = tmp_path / "cuda"
    fake_wheel(cuda, "2.14.1+cu130")
    # pip new enough for dependency groups comes from the folder, torch from the CUDA "mirror"
    pip_only = tmp_path / "pip-only"
    pip_only.mkdir()
    for wheel in wheels.glob("pip-*.whl"):
        shutil.copy(wheel, pip_only)
    done = install_tiny(project, TORCH_INDEX=cuda.as_uri(), PIP_INDEX_URL=pip_only.as_uri())
    assert done.returncode == 1
    *before, line = done.stderr.splitlines()
    assert before == ["removed the unfinished .venv"]
    assert line.startswith("make install: pip would take torch 2.14.1+cu130"), line
    assert not (project / ".venv").exists()


def test_make_wheels_brings_its_own_pip_where_the_python_has_none(
    tmp_path: Path, wheels: Path, python: str
) -> None:
    """A fresh project: no environment, and a Python without pip (or with one too old for
    dependency groups). `make wheels-cpu` makes a throwaway pip; the folder then installs."""
    bare = tmp_path / "bare"  # a Python without pip, as a system's python3 may be
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    project = tiny(tmp_path)
    cpu = tmp_path / "cpu"
    fake_wheel(cpu, "2.13.0+cpu")
    # The "package index" is the folder of the fixture (pip and setuptools), read alone.
    index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "TORCH_INDEX": cpu.as_uri()}
    command = [str(bare / "bin" / "python"), "tools/install.py", "venv", "--variant", "cpu"]
    done = run([*command, "--download"], project, index)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "-m venv " in done.stdout and "pip>=25.1" in done.stdout  # the throwaway pip
    assert done.stdout.splitlines()[-1].startswith(
        f"make wheels: {project / 'wheels'} holds what make install-cpu takes here"
    )
    assert not (project / ".venv").exists()
    names = sorted(wheel.name.split("-")[0] for wheel in (project / "wheels").glob("*.whl"))
    assert names == ["pip", "setuptools", "torch"], names
    # make install-cpu takes it (test_an_offline_install_from_wheels_...); make install of
    # another variant is told which command fills the folder for it.
    folder = str(project / "wheels")
    assert tool.torch_choice(python, "cpu", {"WHEELS": folder}) == "2.13.0+cpu"
    with pytest.raises(tool.InstallError) as refused:
        tool.torch_choice(python, "cu126", {"WHEELS": folder})
    assert str(refused.value) == (
        f"the folder {folder} holds torch 2.13.0+cpu, not the cu126 build; nothing was "
        "installed. Fill it with `make wheels TORCH_VARIANT=cu126` where there is internet"
    )


def fake_conda(folder: Path, fail: str = "") -> Path:
    """A `conda` whose `env create --prefix P` makes a venv at P (or fails with `fail`)."""
    script = folder / "conda"
    failing = f'echo "CondaError: {fail}"; mkdir -p .conda/conda-meta; exit 1' if fail else ""
    script.write_text(
        "#!/bin/bash\n"
        'echo "conda $*" >>conda.log\n'
        f"{failing}\n"
        f'[ "$2" = create ] && exec {sys.executable} -m venv "$4"\n'
        "exit 0\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_conda_route_checks_torch_before_it_updates_an_existing_environment(
    tmp_path: Path, wheels: Path
) -> None:
    project = tiny(tmp_path)
    (project / ".env").write_text(f"WHEELS={wheels}\n", encoding="utf-8")
    command = [sys.executable, "tools/install.py", "conda", "--variant", "cpu"]
    done = run([*command, "--conda", str(fake_conda(tmp_path, fail="no channel"))], project)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        "make install: conda env create failed (CondaError: no channel); check conda's channels"
    )
    assert not (project / ".conda").exists()  # removed: this install had made it
    conda = str(fake_conda(tmp_path))
    done = run([*command, "--conda", conda], project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.splitlines()[-1] == "make install: done, torch 2.13.0+cpu in .conda/"
    # Again, with a CUDA build offered: refused before conda touches the environment.
    (project / ".env").write_text("", encoding="utf-8")
    (project / ".venv").mkdir()
    cuda = tmp_path / "cuda"
    fake_wheel(cuda, "2.14.1+cu130")
    env = {"TORCH_INDEX": cuda.as_uri(), "PIP_FIND_LINKS": str(tmp_path / "no-links")}
    done = run([*command, "--variant", "cu126", "--conda", conda], project, env)
    assert done.returncode == 1
    assert "not the cu126 build" in done.stderr.splitlines()[-1]
    log = (project / "conda.log").read_text("utf-8").splitlines()
    assert [entry.split()[2] for entry in log] == ["create", "create"]  # never `update`
    assert (project / ".conda" / "bin" / "python").exists()  # an existing one stays


# --- a real bake, without a network ------------------------------------------------------------


@pytest.mark.slow
def test_make_wheels_then_make_install_cpu_without_a_network(
    template: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    no_net = offline()
    project = working_copy(baked("venv-grete", template, tmp_path_factory).project, tmp_path)
    # The route as the README prints it, on a fresh bake: python3 (and python3.X) has no pip,
    # so `make wheels-cpu` makes its own; torch's index is a local one holding the CPU wheel
    # on disk, everything else comes from the package index.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {
        "PATH": f"{bare / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TORCH_INDEX": torch_index(tmp_path),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
    }
    done = run(["make", "wheels-cpu"], project, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith(
        f"make wheels: {project / 'wheels'} holds what make install-cpu takes here"
    )
    assert not (project / ".venv").exists()
    (project / ".env").write_text("WHEELS=wheels\n", encoding="utf-8")  # relative: the project's
    done = run([*no_net, "make", "install-cpu"], project, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "make install: done, torch 2.13.0+cpu in .venv/" in done.stdout
    python = str(project / ".venv" / "bin" / "python")
    check = run([python, "-c", f"import matplotlib, pytest, torch, {project.name}"], project)
    assert check.returncode == 0, check.stderr
    # Again: the installed torch is kept, the project reinstalled, still offline.
    done = run([*no_net, "make", "install-cpu"], project, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch 2.13.0+cpu (cpu) is installed: kept" in done.stdout
