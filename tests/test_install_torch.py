"""`make install`'s torch step (tools/install_torch.py) with pip configured as cluster sites do.

Two local wheel indexes stand in for PyTorch's CPU index and a site mirror named as an extra
index: the mirror offers a newer CUDA build (``2.14.1+cu130``), which pip on its own prefers.
The wheels are tiny fakes, so nothing is downloaded. The step must take the variant's build
from its own index, and refuse, before installing anything, an index whose newest torch is
another build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from engines import ROOT

TOOL = ROOT / "{{cookiecutter.project_slug}}" / "tools" / "install_torch.py"


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


def install(python: str, variant: str, index: Path, mirror: Path) -> subprocess.CompletedProcess:
    """The torch step as `make install` runs it, pip configured as a site's."""
    env = site(mirror)
    command = [python, str(TOOL), variant, index.as_uri(), "--python", python]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def installed(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "none"


def test_the_variant_comes_from_its_index_whatever_pip_is_configured_with(
    python: str, tmp_path: Path
) -> None:
    cpu, mirror = tmp_path / "cpu", tmp_path / "mirror"
    fake_wheel(cpu, "2.13.0+cpu")
    fake_wheel(mirror, "2.14.1+cu130")
    # What pip does on its own with such a configuration: the newer CUDA build.
    env = site(mirror)
    plain = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "torch>=2.4,<3"]
    done = subprocess.run(
        [*plain, "--index-url", cpu.as_uri()], env=env, capture_output=True, text=True, check=False
    )
    assert "Would install torch-2.14.1+cu130" in done.stdout, done.stdout + done.stderr

    done = install(python, "cpu", cpu, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"torch 2.13.0+cpu (cpu) from {cpu.as_uri()}/torch/" in done.stdout
    assert installed(python) == "2.13.0+cpu"


def test_an_index_that_offers_another_build_is_refused_before_anything_is_installed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = tmp_path_factory.mktemp("refused") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = str(env / "bin" / "python")
    wrong, mirror = tmp_path / "wrong", tmp_path / "mirror"
    fake_wheel(wrong, "2.14.1+cu130")  # a "CPU mirror" that holds a CUDA build
    fake_wheel(mirror, "2.12.0+cu126")
    done = install(python, "cpu", wrong, mirror)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("make install: pip would take torch 2.14.1+cu130 (file://"), line
    assert f"not the cpu build of --index-url {wrong.as_uri()}; nothing was installed" in line
    assert "TORCH_INDEX=<url>" in line
    assert installed(python) == "none"
    done = install(python, "cu130", wrong, mirror)  # the same index is right for its variant
    assert done.returncode == 0, done.stderr
    assert installed(python) == "2.14.1+cu130"


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
    sys.path.insert(0, str(TOOL.parent))
    try:
        import install_torch  # noqa: PLC0415
    finally:
        sys.path.remove(str(TOOL.parent))
    assert install_torch.fits(version, variant, platform) is fits
