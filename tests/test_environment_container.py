"""The Apptainer definition file and its build job, tested without a container engine.

No engine runs here: the definition file is parsed with spython's recipe parser and with a
section splitter, its shell sections are linted with shellcheck and its %test section runs
on the CPU against the project's code; the build script runs for real with a stand-in
`apptainer` command that records what it was asked to do.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from engines import Bake
from envcases import (
    CASES,
    PRESETS,
    answers_of,
    baked_case,
    def_sections,
    install_fake_apptainer,
    run,
    tool,
    working_copy,
)
from spython.main.parse.parsers import SingularityParser

APPTAINER_CASES = sorted(c for c in CASES if answers_of(c)["environment"] == "apptainer")
# Section names Apptainer knows (definition_files docs); %app* sections are SCIF apps.
KNOWN_SECTIONS = {
    "setup",
    "files",
    "post",
    "test",
    "environment",
    "runscript",
    "startscript",
    "labels",
    "help",
}
REQUIRED_SECTIONS = {"files", "post", "test", "environment", "runscript", "labels", "help"}
SHELL_SECTIONS = ("post", "environment", "runscript", "test")


@pytest.fixture(scope="module", params=sorted(CASES))
def any_case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    return baked_case(request.param, template, tmp_path_factory)


@pytest.fixture(scope="module", params=APPTAINER_CASES)
def case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Bake, dict[str, str]]:
    return baked_case(request.param, template, tmp_path_factory)


def _def_file(project: Path) -> Path:
    return project / "container" / f"{project.name}.def"


def test_container_files_exist_only_for_apptainer(any_case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = any_case
    container = result.project / "container"
    files = sorted(p.name for p in container.iterdir()) if container.is_dir() else []
    if answers["environment"] == "apptainer":
        assert files == ["build.sh", f"{result.project.name}.def"]
        assert os.access(container / "build.sh", os.X_OK)
    else:
        assert files == []


def test_definition_parses_with_spython(case: tuple[Bake, dict[str, str]]) -> None:
    result, _ = case
    slug = result.project.name
    header, _ = def_sections(_def_file(result.project).read_text("utf-8"))
    declared = dict(line.split(":", 1) for line in header if re.match(r"^\w+:", line))
    recipe = SingularityParser(str(_def_file(result.project))).recipe["spython-base"]
    assert recipe.fromHeader == declared["From"].strip()
    assert f"src /opt/{slug}/src" in recipe.files
    assert any(line.startswith("org.opencontainers.image.title ") for line in recipe.labels)
    assert "PYTHONNOUSERSITE=1" in recipe.environ
    assert recipe.cmd == f'exec {slug} train "$@"'
    assert any(f'-m pip install "/opt/{slug}' in line for line in recipe.install)


def test_definition_structure(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    project, slug = result.project, result.project.name
    header, sections = def_sections(_def_file(project).read_text("utf-8"))
    keywords = [line for line in header if line.strip() and not line.lstrip().startswith("#")]
    assert keywords[0] == "Bootstrap: docker", "Bootstrap must be the first header line"
    base = next(line.split(":", 1)[1].strip() for line in keywords if line.startswith("From:"))
    # A pinned PyTorch CUDA image: explicit versions, never a moving tag.
    pinned = re.fullmatch(
        r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+)\.(\d+)-cudnn\d+-runtime", base
    )
    assert pinned, base
    assert set(sections) <= KNOWN_SECTIONS, set(sections) - KNOWN_SECTIONS
    assert set(sections) >= REQUIRED_SECTIONS
    # %files: every source exists in the project, only code and configs enter the image.
    for line in filter(str.strip, sections["files"]):
        source, dest = line.split()
        assert (project / source).exists(), f"%files source {source} is not in the project"
        assert dest == f"/opt/{slug}/{source}"
        assert not source.startswith((".env", "data", "runs", "logs", "container")), source
    # %labels: `key value` lines; the base image label names the From image.
    labels = dict(line.split(maxsplit=1) for line in filter(str.strip, sections["labels"]))
    assert labels["org.opencontainers.image.base.name"] == f"docker.io/{base}"
    # %post: the wheel index for a second Python matches the base image's CUDA version.
    post = "\n".join(sections["post"])
    assert f"download.pytorch.org/whl/cu{pinned[2]}{pinned[3]}" in post
    assert f'"python={answers["python_version"]}"' in post
    extras = "" if answers["tracking"] == "csv" else f"[{answers['tracking']}]"
    assert f'-m pip install "/opt/{slug}{extras}"' in post
    # %help names the image where the Makefile and the job scripts expect it.
    assert f"container/{slug}.sif" in "\n".join(sections["help"])


def _section_script(sections: dict[str, list[str]], name: str) -> str:
    return "#!/bin/sh\n" + textwrap.dedent("\n".join(sections[name])) + "\n"


@pytest.mark.parametrize("section", SHELL_SECTIONS)
def test_shell_sections_pass_shellcheck(
    case: tuple[Bake, dict[str, str]], section: str, tmp_path: Path
) -> None:
    result, _ = case
    _, sections = def_sections(_def_file(result.project).read_text("utf-8"))
    script = tmp_path / f"{section}.sh"
    script.write_text(_section_script(sections, section))
    # Apptainer runs these sections with /bin/sh: POSIX shell, not bash.
    syntax = run(["sh", "-n", str(script)], tmp_path)
    assert syntax.returncode == 0, syntax.stderr
    lint = run([tool("shellcheck"), "--shell=sh", str(script)], tmp_path)
    assert lint.returncode == 0, lint.stdout


def test_post_picks_a_python_the_project_accepts(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    """The %post test of the image's Python agrees with the project's requires-python."""
    result, answers = case
    _, sections = def_sections(_def_file(result.project).read_text("utf-8"))
    condition = next(
        line.strip() for line in sections["post"] if line.strip().startswith("if python -c")
    )
    command = condition.removeprefix("if ").removesuffix("; then")
    # This interpreter stands in for the image's: the branch must follow its version.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python").symlink_to(sys.executable)
    done = run(["sh", "-c", command], tmp_path, {"PATH": f"{shim}:{os.environ['PATH']}"})
    wanted = tuple(int(part) for part in answers["python_version"].split("."))
    assert (done.returncode == 0) == (sys.version_info[:2] >= wanted)


def test_test_section_runs_on_cpu(case: tuple[Bake, dict[str, str]], tmp_path: Path) -> None:
    """%test (run at the end of every build, maybe without a GPU) passes with %environment set."""
    result, _ = case
    project = working_copy(result.project, tmp_path)
    slug = project.name
    _, sections = def_sections(_def_file(project).read_text("utf-8"))
    # The console script as pip installs it in the image: here it runs the project's source.
    shim = tmp_path / "bin"
    shim.mkdir()
    command = shim / slug
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {slug} "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "test.sh"
    script.write_text(_section_script(sections, "environment") + _section_script(sections, "test"))
    env = {
        "PATH": f"{shim}:{os.environ['PATH']}",
        "PYTHONPATH": str(project / "src"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    done = run(["sh", "-eu", str(script)], project, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# --- build job ---------------------------------------------------------------------------------


def _build_env(
    tmp_path: Path, project: Path, tmp_var: str, *, gpu: bool = False
) -> dict[str, str | None]:
    bin_dir = install_fake_apptainer(tmp_path / "fakebin")
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100'\n")
        smi.chmod(0o755)
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "node").mkdir(exist_ok=True)
    env: dict[str, str | None] = dict.fromkeys(
        ["APPTAINER_CACHEDIR", "APPTAINER_TMPDIR", "LOCAL_TMPDIR", "TMPDIR"]
    )
    env |= {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "USER": "tester",
        tmp_var: str(tmp_path / "node"),
        "SLURM_SUBMIT_DIR": str(project),
        "SLURM_JOB_ID": "4242",
        "FAKE_APPTAINER_LOG": str(tmp_path / "apptainer.log"),
    }
    return env


def test_build_script_builds_off_home_and_renames_at_the_end(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    result, answers = case
    project = working_copy(result.project, tmp_path)
    slug = project.name
    tmp_var = PRESETS[answers["cluster"]]["node_tmp_var"]
    env = _build_env(tmp_path, project, tmp_var)
    done = run(["bash", "container/build.sh"], project, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "container" / f"{slug}.sif").read_text() == "image\n"
    assert not list((project / "container").glob("*.partial*"))
    log = (tmp_path / "apptainer.log").read_text().splitlines()
    assert f"cwd={project}" in log  # %files paths are relative to the project root
    build_args = next(line for line in log if line.startswith("args=build"))
    assert (
        build_args
        == f"args=build --fakeroot container/{slug}.sif.partial.4242 container/{slug}.def"
    )
    node = tmp_path / "node"
    assert f"cache={node}/apptainer-cache-tester" in log
    assert f"tmp={node}/apptainer-tmp-tester" in log
    assert not any(str(tmp_path / "home") in line for line in log)


def test_build_script_uses_the_gpu_when_there_is_one(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    result, answers = case
    project = working_copy(result.project, tmp_path)
    env = _build_env(tmp_path, project, PRESETS[answers["cluster"]]["node_tmp_var"], gpu=True)
    env["USER"] = None  # not every batch environment sets it
    done = run(["bash", "container/build.sh"], project, env)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "apptainer.log").read_text()
    assert "args=build --fakeroot --nv " in log
    assert f"cache={tmp_path}/node/apptainer-cache-{pwd.getpwuid(os.getuid()).pw_name}" in log


def test_failed_build_keeps_the_old_image(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    result, answers = case
    project = working_copy(result.project, tmp_path)
    image = project / "container" / f"{project.name}.sif"
    image.write_text("old image\n")
    env = _build_env(tmp_path, project, PRESETS[answers["cluster"]]["node_tmp_var"])
    env["FAKE_APPTAINER_FAIL"] = "1"
    done = run(["bash", "container/build.sh"], project, env)
    assert done.returncode != 0
    assert image.read_text() == "old image\n"
    assert not list((project / "container").glob("*.partial*"))


def test_build_script_outside_the_project_fails_clearly(
    case: tuple[Bake, dict[str, str]], tmp_path: Path
) -> None:
    result, answers = case
    project = working_copy(result.project, tmp_path)
    env = _build_env(tmp_path, project, PRESETS[answers["cluster"]]["node_tmp_var"])
    env["SLURM_SUBMIT_DIR"] = str(tmp_path)
    done = run(["bash", str(project / "container" / "build.sh")], tmp_path, env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: container/{project.name}.def not found; run this from the project root"
    ]
    assert not (tmp_path / "apptainer.log").exists()


def test_build_job_header(case: tuple[Bake, dict[str, str]]) -> None:
    result, answers = case
    preset = PRESETS[answers["cluster"]]
    lines = (result.project / "container" / "build.sh").read_text("utf-8").splitlines()
    first_command = next(
        i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")
    )
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH")]
    # Slurm stops reading #SBATCH lines at the first command.
    assert all(lines.index(f"#SBATCH {d}") < first_command for d in directives)
    assert f"--partition={preset['interactive_partition']}" in directives
    assert preset["interactive_gpu_request"] in directives
    account = answers.get("account", "")
    assert (f"--account={account}" in directives) == bool(account)
    assert "--output=logs/%x-%j.out" in directives
    assert (result.project / "logs").is_dir()
    assert not [d for d in directives if "$" in d or "~" in d], "#SBATCH values are not expanded"
