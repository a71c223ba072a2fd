"""The generated project's working environment: pre-commit, pyproject, CI, Makefile, conda, .env.

Every environment choice (venv, conda, apptainer) is baked with both presets (envcases.py).
pre-commit runs for real on every bake; its hook environments are installed from the package
index once and shared through pre-commit's cache ($PRE_COMMIT_HOME, default ~/.cache).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from importlib.metadata import version as metadata_version
from pathlib import Path

import pytest
import yaml
from engines import BIN, Bake, make_value
from envcases import (
    CASES,
    PRESETS,
    answers_of,
    baked,
    baked_case,
    pyproject,
    run,
    tool,
    working_copy,
)
from gen_hook_data import closure, top_level_modules
from packaging.requirements import Requirement

REQUIRED_TARGETS = {"help", "install", "data", "train", "test", "lint", "submit", "template-status"}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    return baked_case(request.param, template, tmp_path_factory)


# pre-commit runs with no project environment active and nothing on PYTHONPATH, as in a
# fresh clone or the project's CI lint job: every hook must bring what it needs.
CLEAN_ENV: dict[str, str | None] = {"PYTHONPATH": None, "VIRTUAL_ENV": None}


# --- pre-commit -------------------------------------------------------------------------------


def _hooks(project: Path) -> list[dict]:
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text("utf-8"))
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def test_pre_commit_needs_no_code_host(case: tuple[Bake, dict[str, str]]) -> None:
    result, _ = case
    config = yaml.safe_load((result.project / ".pre-commit-config.yaml").read_text("utf-8"))
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    pins: dict[str, str] = {}
    for hook in _hooks(result.project):
        assert hook["language"] in {"python", "system"}, hook["id"]
        for requirement in hook.get("additional_dependencies", []):
            name, _, version = requirement.partition("==")
            assert version, f"{hook['id']}: {requirement} is not pinned with =="
            assert pins.setdefault(name, version) == version, f"two pins of {name}"
    wanted = {
        "ruff-check",
        "ruff-format",
        "mypy",
        "codespell",
        "nbstripout",
        "check-added-large-files",
        "raw-data-guard",
    }
    assert wanted <= {hook["id"] for hook in _hooks(result.project)}
    # The editor, `make format` and CI use the dev group's tools: the same versions as the hooks.
    dev = pyproject(result.project)["dependency-groups"]["dev"]
    for tool_name in ("ruff", "mypy", "codespell"):
        assert f"{tool_name}=={pins[tool_name]}" in dev


def test_pre_commit_passes_for_real(case: tuple[Bake, dict[str, str]], tmp_path: Path) -> None:
    result, _ = case
    project = working_copy(result.project, tmp_path)
    # `make lint` with the test environment standing in for the project's .venv/.conda.
    done = run(["make", "lint", f"ENV_DIR={BIN.parent}"], project, CLEAN_ENV)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    for hook in _hooks(project):
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith(hook["name"])), "")
        assert line.endswith(("Passed", "Skipped")), f"{hook['id']}: {line or 'did not run'}"
    assert "Passed" in done.stdout
    changed = run(["git", "status", "--porcelain"], project).stdout
    assert not [ln for ln in changed.splitlines() if not ln.startswith("A ")], changed


def test_pre_commit_catches_real_problems(
    template: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    result = baked("venv-grete", template, tmp_path_factory)
    project = working_copy(result.project, tmp_path)
    scratch = project / "src" / project.name / "scratch.py"
    scratch.write_text('"""Scratch."""\n\nimport os\n')
    (project / "notes.txt").write_text("trailing   \n")
    (project / "weights.bin").write_bytes(b"\0" * 2_000_000)
    (project / "id_test").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 3,
                "metadata": {},
                "source": ["1 + 1"],
                "outputs": [
                    {
                        "output_type": "execute_result",
                        "execution_count": 3,
                        "data": {"text/plain": ["2"]},
                        "metadata": {},
                    }
                ],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (project / "notebooks" / "explore.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    run(["git", "add", "-A"], project)
    # A new task module not added to git yet: pre-commit alone would not see it.
    untracked = project / "src" / project.name / "tasks" / "fresh.py"
    untracked.write_text('"""A task in the making."""\n\nimport sys\n')
    # What `copier update` leaves in a file both sides changed, unstaged, and exits 0 on.
    job = project / "slurm" / "train.sbatch"
    lines = job.read_text("utf-8").splitlines(keepends=True)
    job.write_text(
        "".join(lines[:3])
        + "<<<<<<< before updating\n#SBATCH --time=01:00:00\n=======\n"
        + "#SBATCH --time=02:00:00\n>>>>>>> after updating\n"
        + "".join(lines[3:])
    )
    # The project's own `make lint`, with the test environment standing in for its .venv.
    done = run(["make", "lint", f"ENV_DIR={BIN.parent}"], project, CLEAN_ENV)
    assert done.returncode != 0
    assert "slurm/train.sbatch:4: Merge conflict string '<<<<<<<' found" in done.stdout
    failed = {
        ln.rsplit(".", 1)[0].rstrip(".") for ln in done.stdout.splitlines() if ln.endswith("Failed")
    }
    names = {hook["id"]: hook["name"] for hook in _hooks(project)}
    for hook_id in (
        "ruff-check",
        "trailing-whitespace",
        "check-added-large-files",
        "detect-private-key",
        "nbstripout",
        "check-merge-conflict",
    ):
        assert names[hook_id] in failed, f"{hook_id} did not fail:\n{done.stdout[-4000:]}"
    stripped = json.loads((project / "notebooks" / "explore.ipynb").read_text())
    assert stripped["cells"][0]["outputs"] == []
    assert "import os" not in scratch.read_text()
    assert "import sys" not in untracked.read_text()  # ruff --fix reached it
    assert (
        "?? " + str(untracked.relative_to(project)) in run(["git", "status", "-s"], project).stdout
    )


# --- pyproject ---------------------------------------------------------------------------------


def test_pyproject_is_valid_and_complete(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    done = run([tool("validate-pyproject"), "pyproject.toml"], result.project)
    assert done.returncode == 0, done.stdout + done.stderr
    data = pyproject(result.project)
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"
    assert data["project"]["requires-python"] == f">={answers['python_version']}"
    # Tracking backends are extras (a user may switch later); dev tools a PEP 735 group.
    extras = data["project"]["optional-dependencies"]
    assert {"tensorboard", "wandb", "mlflow"} <= set(extras)
    assert extras["mlflow"][0].startswith("mlflow-skinny")
    assert "dev" not in extras
    dev = data["dependency-groups"]["dev"]
    for name in ("pytest", "hypothesis", "pre-commit", "ruff", "mypy", "codespell"):
        assert any(Requirement(req).name == name for req in dev), name
    pytest_cfg = data["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_cfg["addopts"]
    assert pytest_cfg["filterwarnings"][0] == "error"
    assert pytest_cfg["log_level"] == "INFO"
    assert all((result.project / path).is_dir() for path in pytest_cfg["testpaths"])
    ruff = data["tool"]["ruff"]
    assert "target-version" not in ruff  # ruff reads requires-python
    assert {"E", "F", "I", "B", "UP", "D", "S"} <= set(ruff["lint"]["select"])
    mypy = data["tool"]["mypy"]
    assert mypy["strict"] is True and mypy["files"] == ["src", "tools"]
    assert all((result.project / path).is_dir() for path in mypy["files"])
    uv = data["tool"].get("uv")
    assert (uv is not None) == (answers["environment"] == "uv")
    if uv is not None:
        variant = PRESETS[answers["cluster"]].get("torch_variant", "cu128")
        sources = {s["extra"]: s["index"] for s in uv["sources"]["torch"]}
        assert sources == {"cpu": "pytorch-cpu", variant: f"pytorch-{variant}"}
        urls = {index["name"]: index["url"] for index in uv["index"]}
        assert urls[f"pytorch-{variant}"].endswith(f"/whl/{variant}")
        assert urls["pytorch-cpu"].endswith("/whl/cpu")
        assert all(index["explicit"] for index in uv["index"])
        assert uv["conflicts"] == [[{"extra": "cpu"}, {"extra": variant}]]


# A test that skips without a library, and why: `pytest.importorskip("peft", reason="...")`.
OPTIONAL_IMPORT = re.compile(r'importorskip\(\s*"(\w+)[\w.]*",\s*reason="([^"]*)"')


def test_a_library_a_test_skips_without_comes_with_the_extra_its_reason_names(
    default_bake: Bake,
) -> None:
    """The suite "with every extra" runs every test: each skip's reason names the extra (or
    dev tool) that installs the library, and that one does, directly or through its own."""
    data = pyproject(default_bake.project)
    extras = data["project"]["optional-dependencies"]
    sources = {f"the {name} extra ": reqs for name, reqs in extras.items()}
    sources |= {f"{Requirement(req).name} ": [req] for req in data["dependency-groups"]["dev"]}
    seen = 0
    for path in sorted((default_bake.project / "tests").glob("*.py")):
        for module, reason in OPTIONAL_IMPORT.findall(path.read_text("utf-8")):
            named = [key for key in sources if reason.startswith(key)]
            assert named, f"{path.name}: importorskip({module!r}) names no extra: {reason!r}"
            installs = closure([Requirement(req) for req in sources[named[0]]])
            assert module in {m for dist in installs for m in top_level_modules(dist)}, (
                f"{path.name}: {named[0].strip()} does not install {module}"
            )
            seen += 1
    assert seen >= 10, seen  # the pattern still finds the suite's optional imports


def test_project_builds_a_wheel_with_its_command(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    """The first step of `make install`, environment.yml and %post: building the project."""
    result, answers = case
    slug = result.project.name
    project = working_copy(result.project, tmp_path)
    # The build backend of this environment stands in for pip's isolated build environment
    # (no download); it must satisfy the project's build requirements.
    for requirement in map(Requirement, pyproject(project)["build-system"]["requires"]):
        assert requirement.specifier.contains(metadata_version(requirement.name)), requirement
    wheel_args = ["wheel", "--no-deps", "--no-build-isolation", "--ignore-requires-python", "-q"]
    done = run(
        [sys.executable, "-m", "pip", *wheel_args, "-w", str(tmp_path / "dist"), "."], project
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob(f"{slug}-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(f"{slug}-0.1.0.dist-info/entry_points.txt").decode()
        metadata = archive.read(f"{slug}-0.1.0.dist-info/METADATA").decode()
    assert f"{slug}/cli.py" in names
    assert f"{slug} = {slug}.cli:main" in entry_points
    assert f"Requires-Python: >={answers['python_version']}" in metadata
    if answers["license"] != "proprietary":
        assert f"License-Expression: {answers['license']}" in metadata


# --- project CI --------------------------------------------------------------------------------

CI_FILES = {"gitlab": ".gitlab-ci.yml", "github": ".github/workflows/ci.yml"}
SCHEMAS = {"gitlab": "vendor.gitlab-ci", "github": "vendor.github-workflows"}


def test_ci_file_matches_answer_and_published_schema(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    present = {ci for ci, path in CI_FILES.items() if (result.project / path).exists()}
    assert present == ({answers["ci"]} - {"none"})
    if answers["ci"] == "none":
        return
    path = CI_FILES[answers["ci"]]
    # check-jsonschema ships ("vendors") the published schemas: no download.
    done = run(
        [tool("check-jsonschema"), "--builtin-schema", SCHEMAS[answers["ci"]], path], result.project
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (result.project / path).read_text("utf-8")
    assert "{%" not in text and "{{ cookiecutter" not in text
    assert "pre-commit run --all-files" in text
    extra = "" if answers["tracking"] == "csv" else answers["tracking"]
    if answers["environment"] == "uv":
        # The committed lock with the CPU build of torch, then the tests in that environment.
        sync = "uv sync --locked --extra cpu" + (f" --extra {extra}" if extra else "")
        assert text.index(sync) < text.index("uv run --no-sync pytest")
    else:
        # CPU wheels of torch first, then the project with its dev tools, then the tests.
        torch = text.index("download.pytorch.org/whl/cpu")
        install = 'install -e ".' + (f"[{extra}]" if extra else "") + '" --group dev'
        assert torch < text.index(install) < text.index("pytest")
    assert answers["python_version"] in text
    data = yaml.safe_load(text)
    if answers["ci"] == "gitlab":
        assert data["variables"]["PIP_CACHE_DIR"].startswith("$CI_PROJECT_DIR/")
        assert ".cache/pip" in data["test"]["cache"]["paths"]
        assert ".cache/pre-commit" in data["lint"]["cache"]["paths"]
    else:
        steps = data["jobs"]["test"]["steps"]
        assert any(s.get("with", {}).get("cache") == "pip" for s in steps)
        assert "${{ github.ref }}" in text


# --- Makefile ----------------------------------------------------------------------------------


def _help_targets(project: Path) -> dict[str, str]:
    done = run(["make", "help"], project)
    assert done.returncode == 0, done.stderr
    found = re.findall(r"^\s*make (\S+)\s+(.+)$", done.stdout, flags=re.MULTILINE)
    return dict(found)


def test_make_help_documents_every_task(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    targets = _help_targets(result.project)
    lines = run(["make", "help"], result.project).stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, "a make help line is wider than 100 columns"
    wanted = REQUIRED_TARGETS | ({"container"} if answers["environment"] == "apptainer" else set())
    assert wanted <= set(targets), targets
    assert ("container" in targets) == (answers["environment"] == "apptainer")
    assert run(["make"], result.project).stdout == run(["make", "help"], result.project).stdout
    for target in targets:
        dry = run(["make", "-n", target], result.project)
        assert dry.returncode == 0, f"make -n {target}: {dry.stderr}"


def _dry(project: Path, *args: str) -> str:
    done = run(["make", "-n", *args], project)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_install_takes_the_environment_and_the_variants_torch(
    case: tuple[Bake, dict[str, str]],
) -> None:
    result, answers = case
    project = result.project

    def dry(*args: str) -> str:
        return _dry(project, *args)

    def value(name: str, *args: str) -> str:
        return make_value(project, name, *args)

    # tools/install.py builds the environment of the route (its tests: tests/test_install.py),
    # with the tracking extra; make wheels runs the same with --download.
    route = {"apptainer": "venv"}.get(answers["environment"], answers["environment"])
    extra = "" if answers["tracking"] == "csv" else answers["tracking"]
    command = f"tools/install.py {route} "
    install, wheels = dry("install"), dry("wheels")
    assert command in install and command in wheels
    options = {
        "conda": ' --conda "',
        "uv": f' --uv "uv" --python-version {answers["python_version"]} ',
    }.get(route, "")
    for dry_run in (install, wheels):
        [line] = [ln for ln in dry_run.splitlines() if command in ln]
        assert options in line
        assert '--variant "$TORCH_VARIANT"' + (f" --extra {extra}" if extra else "") in line
    assert wheels.rstrip().endswith("--download")
    # The preset's CUDA build, or the CPU wheel where the image holds the CUDA one; from
    # PyTorch's index unless TORCH_INDEX (environment or .env) names a mirror.
    variant = (
        "cpu"
        if answers["environment"] == "apptainer"
        else PRESETS[answers["cluster"]].get("torch_variant", "cu128")
    )
    assert value("TORCH_VARIANT") == variant
    assert value("TORCH_VARIANT", "TORCH_VARIANT=cpu") == "cpu"
    assert value("TORCH_INDEX") == "" and value("WHEELS") == ""
    # install-cpu runs install with the variant set (a sub-make would inherit the preset's);
    # wheels-cpu fills the folder install-cpu reads.
    for target in ("install-cpu", "wheels-cpu"):
        assert f"{target}: TORCH_VARIANT := cpu" in dry("-p", target)
        assert command in dry(target)


def test_make_targets_use_the_project_files(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    slug = result.project.name
    project = result.project

    def dry(*args: str) -> str:
        return _dry(project, *args)

    # Values users pass reach a recipe as exported variables ("$JOB", and ARGS read by
    # tools/with_args.py), never pasted into its text (tests/test_makefile_values.py runs
    # them); the defaults name real files.
    assert 'tools/with_args.py sbatch "$JOB"' in dry("submit")
    job = make_value(project, "JOB")
    assert (project / job).is_file(), job
    train = dry("train", "ARGS=train.epochs=1")
    assert "tools/with_args.py " in train and f"-m {slug} train\n" in train
    if answers["environment"] == "apptainer":
        raw = f"{project}/data/raw"
        assert f"apptainer exec --nv --bind {raw}:{raw}:ro --env PYTHONPATH={project}/src" in train
        assert f"container/{slug}.sif python -m {slug} train" in train
        assert "sbatch container/build.sh" in dry("container")
    # make install registers the environment as a Jupyter kernel named like the package; with
    # apptainer the kernel runs in the image, as training does.
    assert "hooks kernel" in dry("install")
    kernel = dry("kernel")
    if answers["environment"] == "apptainer":
        image = f"--env PYTHONPATH={project}/src {project}/container/{slug}.sif python"
        assert image in kernel and '"ipykernel_launcher"' in kernel
        assert f"kernelspec install --user --name {slug} build/kernel" in kernel
    else:
        assert f"-m ipykernel install --user --name {slug} --display-name {slug}" in kernel
    assert "git ls-files -z --others --exclude-standard" in dry("lint")
    assert "pre-commit run --files" in dry("lint")
    assert "-m pytest" in dry("test")


# --- conda -------------------------------------------------------------------------------------


def test_conda_environment_installs_the_project(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    path = result.project / "environment.yml"
    assert path.exists() == (answers["environment"] == "conda")
    if not path.exists():
        return
    env = yaml.safe_load(path.read_text("utf-8"))
    assert env["name"] == result.project.name
    assert env["channels"][0] == "conda-forge"
    assert f"python={answers['python_version']}" in env["dependencies"]
    assert "pip>=25.1" in env["dependencies"]  # installs the dev dependency group
    # No pip part: `make install` adds torch from the preset's wheel index, then the project.
    assert not [d for d in env["dependencies"] if isinstance(d, dict)]
    install = run(["make", "-n", "install"], result.project).stdout
    match = re.search(
        r'tools/install\.py conda .*--variant "\$TORCH_VARIANT"(?: --extra (\w+))?', install
    )
    assert match, install
    extras = {match[1]} if match[1] else set()
    assert extras <= set(pyproject(result.project)["project"]["optional-dependencies"])
    assert extras == ({answers["tracking"]} - {"csv"})


@pytest.mark.parametrize(
    "name", [c for c in sorted(CASES) if answers_of(c)["environment"] == "conda"]
)
def test_conda_install_without_conda_says_what_to_load(
    name: str, template: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    result = baked(name, template, tmp_path_factory)
    answers = answers_of(name)
    project = working_copy(result.project, tmp_path)
    env = {"PATH": "/usr/bin:/bin", "CONDA_EXE": None}
    done = run(["make", "install"], project, env)
    assert done.returncode != 0
    message = done.stderr.splitlines()[0]
    assert message.startswith("conda not found: load its module first")
    modules = PRESETS[answers["cluster"]]["modules"]
    assert (f"(module load {' '.join(modules)})" in message) == bool(modules)
    assert not (project / ".conda").exists()


# --- README ------------------------------------------------------------------------------------


def test_readme_first_screen_has_the_environment_commands(
    case: tuple[Bake, dict[str, str]],
) -> None:
    result, answers = case
    readme = (result.project / "README.md").read_text("utf-8")
    cluster = readme.index("## First steps on the cluster")  # after the laptop's two commands
    first_block = re.search(r"```bash\n(.*?)```", readme[cluster:], flags=re.DOTALL)
    assert first_block and cluster < 1200, "no cluster commands on the first screen"
    commands = first_block[1]
    preset = PRESETS[answers["cluster"]]
    for module in preset["modules"]:
        assert f"module load {module}" in commands
    targets = _help_targets(result.project)
    for target in re.findall(r"^make (\w+)", commands, flags=re.MULTILINE):
        assert target in targets, f"README runs `make {target}`, which the Makefile lacks"
    expected = {
        "venv": ["make install", "source .venv/bin/activate"],
        "conda": ["make install", "conda activate ./.conda"],
        "apptainer": ["make install", "make container"],
        "uv": ["make install", "git add uv.lock", "source .venv/bin/activate"],
    }[answers["environment"]]
    for line in expected:
        assert line in commands, f"{line!r} missing from the first command block"


# --- .env --------------------------------------------------------------------------------------


def test_env_file_is_ignored_and_documented(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    result, _ = case
    project = working_copy(result.project, tmp_path)
    (project / ".env").write_text("DATA_DIR=/somewhere\n")
    assert run(["git", "check-ignore", "-q", ".env"], project).returncode == 0
    # Environments, images and half-built images never end up in a commit either.
    slug = project.name
    for path in (
        ".venv/bin/python",
        ".conda/bin/python",
        f"container/{slug}.sif",
        f"container/{slug}.sif.partial.7",
    ):
        assert run(["git", "check-ignore", "-q", path], project).returncode == 0, path
    for path in (
        ".vscode/settings.json",
        "container/build.sh",
        f"container/{slug}.def",
        "environment.yml",
    ):
        assert run(["git", "check-ignore", "-q", path], project).returncode == 1, path
    assert run(["git", "check-ignore", "-q", ".env.example"], project).returncode == 1
    assert (project / ".env.example").is_file()
    # `.env` is read in exactly one module: the only one that imports python-dotenv.
    package = project / "src" / project.name
    readers = sorted(p.name for p in package.rglob("*.py") if _imports_dotenv(p))
    assert readers == ["settings.py"]


def _imports_dotenv(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dotenv":
            return True
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "dotenv" for a in node.names
        ):
            return True
    return False


# Variables set by Slurm, torchrun or slurm/pack.sbatch for the processes they start: not
# user settings.
LAUNCHER_VARIABLES = {
    "PACKED_RUNS",
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}

# Runs the project's CLI in-process and records every environment variable that code of the
# package reads (not torch's or other libraries' reads), for the check against .env.example.
RECORDER = """
import json, os, sys
package_dir, out = sys.argv[1], sys.argv[2]
seen = set()
STDLIB = ("os", "_collections_abc", "collections.abc")

class Recording(type(os.environ)):
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame and frame.f_globals.get("__name__") in STDLIB:
            frame = frame.f_back
        if frame and frame.f_code.co_filename.startswith(package_dir):
            seen.add(key)
        return super().__getitem__(key)

os.environ.__class__ = Recording
from {slug}.cli import main
code = main(sys.argv[3:])
with open(out, "a") as handle:
    handle.write(json.dumps(sorted(seen)) + "\\n")
sys.exit(code)
"""

SECRETS = {
    "WANDB_API_KEY": "wandb-7f3a9c1e5b2d4f60",
    "HF_TOKEN": "hf_Qx8ZrLw2VnT5yK9mPc3d",
    "MY_SERVICE_PASSWORD": "pw-6b1e0c9a4d7f2e85",
}


def test_env_is_loaded_and_secrets_never_printed_or_logged(
    template: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A full prepare/train/evaluate/doctor cycle with secrets in .env leaks none of them."""
    result = baked("venv-grete", template, tmp_path_factory)
    project = working_copy(result.project, tmp_path)
    slug = project.name
    lines = [f"{key}={value}" for key, value in SECRETS.items()]
    (project / ".env").write_text("\n".join(["RUN_NAME=from-dotenv", *lines]) + "\n")
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORDER.replace("{slug}", slug))
    record = tmp_path / "read.jsonl"
    package_dir = str(project / "src" / slug)
    env: dict[str, str | None] = {"PYTHONPATH": str(project / "src")}
    env |= dict.fromkeys(["PROJECT_ROOT", "RUN_NAME", "DATA_DIR", "RUNS_DIR", *SECRETS], None)
    outputs = []
    for args in (
        ["prepare"],
        ["train", "train.epochs=1", "run.progress=log", "data.num_workers=0"],
        ["evaluate", "--device", "cpu"],
        ["doctor", "--quick"],
    ):
        done = run(
            [sys.executable, str(recorder), package_dir, str(record), *args],
            project,
            env,
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        outputs.append(done.stdout + done.stderr)
    # .env took effect: RUN_NAME from the file named the run.
    assert (project / "runs" / "from-dotenv" / "metrics.csv").is_file()
    written = [p for folder in ("runs", "reports", "logs") for p in (project / folder).rglob("*")]
    texts = outputs + [p.read_bytes().decode("utf-8", "replace") for p in written if p.is_file()]
    for key, secret in SECRETS.items():
        assert not [t for t in texts if secret in t], f"the value of {key} was printed or written"
    # Every variable the package read is documented in .env.example.
    read = set().union(*(json.loads(line) for line in record.read_text().splitlines()))
    documented = set(
        re.findall(
            r"^#?\s*([A-Z][A-Z0-9_]*)=", (project / ".env.example").read_text(), re.MULTILINE
        )
    )
    user_settings = {v for v in read if not v.startswith("SLURM_") and v not in LAUNCHER_VARIABLES}
    assert "RUN_NAME" in read and "PROJECT_ROOT" in read
    assert user_settings <= documented, (
        f"read but not in .env.example: {sorted(user_settings - documented)}"
    )
