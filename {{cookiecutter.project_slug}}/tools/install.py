"""`make install` and `make wheels`: the environment with the torch build it promises, or one line.

Three routes, as the project was generated: ``venv`` (python -m venv, then pip), ``conda``
(environment.yml, then pip) and ``uv`` (uv sync, as uv.lock says). Where packages come from
is read from the environment, else from `.env`, so a site's settings are written down once:

- ``PIP_INDEX_URL``: a site's mirror of PyPI (pip reads it; uv gets it as UV_DEFAULT_INDEX).
- ``TORCH_INDEX``: a mirror of PyTorch's wheel index of the variant (default: PyTorch's own).
- ``WHEELS``: a folder that `make wheels` filled on a machine with network; no index is read
  then (pip: a folder of wheels; uv: uv's cache, read offline). `make wheels` fetches the
  preset's CUDA build of torch for `make install`, `make wheels-cpu` the CPU build for
  `make install-cpu` (TORCH_VARIANT, as for the install).

What it guarantees:

- torch is the variant's build. pip takes the highest version among every index it knows,
  and a site's extra index or find-links folder can offer a newer CUDA build (a ``+cu130``
  label sorts above ``+cpu``): torch comes from the variant's index alone, a dry run names the
  wheel before anything large is downloaded, and what is installed in the end is checked.
  uv takes torch from the index that pyproject.toml names for the variant.
- An environment that this install created is removed when it fails; an existing one is
  changed only after the torch check passed, by pip steps that resolve everything before they
  change anything and undo what they cannot finish.
- Every failure ends in one line that says what failed and names the way out.

Standard library only: it runs before the environment exists.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENT = "torch>=2.4,<3"  # the project's own range (pyproject.toml)
GROUP_PIP = (25, 1)  # the first pip that installs dependency groups (--group dev)
SETTINGS = ("PIP_INDEX_URL", "TORCH_INDEX", "WHEELS")
# The torch check is the install's first contact with an index: where none answers, it says
# so within about 20 s (pip's defaults wait up to five retries of 15 s each, more where pip's
# configuration sets a longer timeout); an index page that answers in 10 s is not refused.
CHECK_PATIENCE = ("--retries", "1", "--timeout", "10")
# The first line of a failed step's output that says why: pip's and conda's errors, uv's
# (which start with a multiplication sign).
ERROR_LINE = re.compile(r"\s*(ERROR:|error:|\N{MULTIPLICATION SIGN}|CondaError)")
# PyTorch's wheel index of a torch build, as the generated pyproject.toml names it for uv.
UV_TORCH_INDEX = re.compile(r'^name = "(pytorch-[\w.-]+)"\s*\nurl = "([^"]+)"', re.M)
# The way out, named in the failure line of each kind of source.
FIX = {
    "index": "where this machine has no internet, name a mirror (PIP_INDEX_URL= and "
    "TORCH_INDEX= in .env) or a folder from `make wheels` (WHEELS= in .env)",
    "wheels": "the folder lacks it: run `make wheels` again where there is internet",
}


class InstallError(Exception):
    """A failed step; its message is the one line the user reads."""


class StepError(InstallError):
    """A command that failed: the line that says why, and its last lines of output."""

    def __init__(self, message: str, reason: str, output: list[str]) -> None:
        """The one line, the reason in it, and the output it was read from."""
        super().__init__(message)
        self.reason = reason
        self.output = output


def dotenv(path: Path) -> dict[str, str]:
    """The `KEY=value` lines of a `.env` file.

    ``export``, quotes and comments are read as python-dotenv reads them in the simple cases
    (python-dotenv itself is not installed yet).
    """
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text("utf-8").splitlines():
        match = re.match(r"\s*(?:export\s+)?([A-Za-z_]\w*)\s*=\s*(.*)$", line)
        if not match:
            continue
        value = match[2].strip()
        if value[:1] in {"'", '"'} and value.endswith(value[0]) and len(value) > 1:
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].strip()
        values[match[1]] = value
    return values


def settings(root: Path = ROOT) -> dict[str, str]:
    """The install settings: each from the environment, else from `.env`.

    The environment wins, as for every other variable of the project; empty ones are left out.
    """
    from_file = dotenv(root / ".env")
    found = {key: os.environ.get(key) or from_file.get(key, "") for key in SETTINGS}
    if found["WHEELS"]:
        found["WHEELS"] = str((root / Path(found["WHEELS"]).expanduser()).resolve())
    return {key: value for key, value in found.items() if value}


def step(command: list[str], env: dict[str, str], what: str, fix: str) -> None:
    """Run `command`, its output shown as it comes; StepError naming `fix` if it fails."""
    print("+", " ".join(command), flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(  # noqa: S603  (pip, conda or uv of the environment being built)
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line.rstrip("\n"), flush=True)
            tail.append(line.rstrip())
    if process.returncode != 0:
        said = [ln.strip() for ln in tail if ERROR_LINE.match(ln)]
        reason = (said or [ln.strip() for ln in tail if ln.strip()] or ["no output"])[0]
        raise StepError(f"{what} failed ({reason}); {fix}", reason, list(tail))


def fits(version: str, variant: str, platform: str = sys.platform) -> bool:
    """Whether torch `version` is the `variant` build (macOS wheels carry no label: CPU)."""
    label = version.partition("+")[2]
    return label == variant or (variant == "cpu" and not label and platform == "darwin")


def torch_index(variant: str, found: dict[str, str]) -> str:
    """The wheel index of the variant: TORCH_INDEX where a site names its mirror."""
    return found.get("TORCH_INDEX") or f"https://download.pytorch.org/whl/{variant}"


def pip_sources(found: dict[str, str], *, torch: str = "") -> tuple[list[str], dict[str, str]]:
    """Options and environment of pip for one step.

    The wheel folder alone where there is one; for torch, its index alone; else pip's
    configuration, with the site's mirror where `.env` names one.

    For torch the environment variable is read after every pip.conf and replaces their
    extra indexes; it names the same index again, as pip drops an empty value and reads
    the files' instead. Find-links, proxy and certificates stay as configured.
    """
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if "WHEELS" in found:  # also in place of pip.conf's find-links, which the option extends
        env["PIP_FIND_LINKS"] = found["WHEELS"]
        return ["--no-index", "--find-links", found["WHEELS"]], env
    if "PIP_INDEX_URL" in found:
        env["PIP_INDEX_URL"] = found["PIP_INDEX_URL"]
    if torch:
        env["PIP_EXTRA_INDEX_URL"] = torch
        return ["--index-url", torch], env
    return [], env


def torch_sources(variant: str, found: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Options and environment of pip for torch: the variant's index alone (or the folder)."""
    return pip_sources(found, torch=torch_index(variant, found))


def make_line(target: str, variant: str) -> str:
    """The make command of `target` (install or wheels) for the variant, as the docs print it."""
    return f"make {target}-cpu" if variant == "cpu" else f"make {target} TORCH_VARIANT={variant}"


def source_fix(found: dict[str, str]) -> str:
    """The way out when a package cannot be fetched from these sources."""
    return FIX["wheels" if "WHEELS" in found else "index"]


def torch_choice(python: str, variant: str, found: dict[str, str]) -> str:
    """The torch version pip would install for the variant from `torch_sources`.

    A dry run (metadata only) names the wheel; its label must be the variant's.
    """
    args, env = torch_sources(variant, found)
    where = " ".join(args)
    look = subprocess.run(  # noqa: S603
        [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--no-deps", "--report", "-", *CHECK_PATIENCE, *args, REQUIREMENT],
        env=env, capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    try:
        wheel = json.loads(look.stdout)["install"][0]
        version, url = wheel["metadata"]["version"], wheel["download_info"]["url"]
    except (ValueError, KeyError, IndexError, TypeError):
        said = [ln.strip() for ln in look.stderr.splitlines() if ln.strip()] or ["no answer"]
        if any(ln.startswith("WARNING: Retrying") for ln in said):  # refused, timed out, no DNS
            said.append("the index did not answer")
        raise InstallError(
            f"pip finds no {REQUIREMENT} at {where} ({said[-1]}); {source_fix(found)}"
        ) from None
    if not fits(version, variant) and "WHEELS" in found:  # filled for another variant
        raise InstallError(
            f"the folder {found['WHEELS']} holds torch {version}, not the {variant} build; "
            f"nothing was installed. Fill it with `{make_line('wheels', variant)}` where there "
            "is internet"
        )
    if not fits(version, variant):  # an index or find-links folder of pip's configuration
        raise InstallError(
            f"pip would take torch {version} ({url}), not the {variant} build of {where}; "
            "nothing was installed. Name a mirror of that index with TORCH_INDEX=<url>, or "
            "take the wheel out of pip's find-links (pip config list)"
        )
    print(f"torch {version} ({variant}) from {url}", flush=True)
    return str(version)


def pip_version(python: str) -> tuple[int, ...]:
    """(major, minor) of the pip that `python` runs; (0,) where it has none."""
    try:
        done = subprocess.run(  # noqa: S603
            [python, "-m", "pip", "--version"],
            capture_output=True, text=True, check=False, cwd=ROOT,
        )  # fmt: skip
    except OSError:  # no such Python (an environment not made yet)
        return (0,)
    match = re.match(r"pip (\d+)\.(\d+)", done.stdout)
    return (int(match[1]), int(match[2])) if match else (0,)


def installed_torch(python: str) -> str:
    """The version of torch installed for `python`, or "none"."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    done = subprocess.run(  # noqa: S603
        [python, "-c", probe], capture_output=True, text=True, check=False, cwd=ROOT
    )
    return done.stdout.strip() or "none"


def check_installed(python: str, variant: str) -> str:
    """The installed torch is the variant's build (a dependency could have replaced it)."""
    version = installed_torch(python)
    if not fits(version, variant):
        raise InstallError(
            f"the environment holds torch {version}, not the {variant} build: a package "
            "required another torch (pip list; pip show torch)"
        )
    return version


def project(extra: str) -> str:
    """The editable project, with its extra where one is chosen."""
    return f".[{extra}]" if extra else "."


def in_range(version: str) -> bool:
    """Whether a torch version is within the project's range (2.4 up to 3)."""
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return (2, 4) <= (major, minor) < (3, 0)


def plan_torch(python: str, variant: str, found: dict[str, str]) -> str | None:
    """The torch to install, or None where the installed one is the variant's and in range.

    An installed torch is kept: running make install again costs no download of gigabytes
    and changes no version that results were produced with.
    """
    current = installed_torch(python)
    if current != "none" and fits(current, variant) and in_range(current):
        print(f"torch {current} ({variant}) is installed: kept", flush=True)
        return None
    return torch_choice(python, variant, found)


def pip_install(
    python: str,
    variant: str,
    extra: str,
    found: dict[str, str],
    torch: str | None,
) -> None:
    """Install `torch` (its version from `torch_sources`; None: keep it), then the project.

    pip first becomes a version that installs dependency groups; torch comes alone
    (--no-deps), its own dependencies with the project's and its dev tools.
    """
    args, env = pip_sources(found)
    fix = source_fix(found)
    if pip_version(python) < GROUP_PIP:
        step([python, "-m", "pip", "install", "--upgrade", *args, "pip>=25.1"], env,
             "upgrading pip", fix)  # fmt: skip
    if torch is not None:
        torch_args, torch_env = torch_sources(variant, found)
        step([python, "-m", "pip", "install", "--no-deps", *torch_args, f"torch=={torch}"],
             torch_env, f"installing torch {torch}", fix)  # fmt: skip
    step([python, "-m", "pip", "install", *args, "-e", project(extra), "--group", "dev"], env,
         "installing the project", fix)  # fmt: skip


def transaction(env_dir: Path, build: Callable[[bool], None]) -> None:
    """Run `build(fresh)`; remove the environment again when it was made here and failed."""
    fresh = not (env_dir / "bin" / "python").exists()
    if fresh and env_dir.exists():
        shutil.rmtree(env_dir)  # the leftover of a killed install: no Python in it
    try:
        build(fresh)
    except BaseException:
        if fresh and env_dir.exists():
            shutil.rmtree(env_dir, ignore_errors=True)
            print(f"removed the unfinished {env_dir.name}", file=sys.stderr)
        raise


def env_python(route: str) -> str:
    """The Python of the environment that `route` builds, relative to the project.

    The project is the working folder of every step, so the commands shown read as one would
    type them.
    """
    return f"{'.conda' if route == 'conda' else '.venv'}/bin/python"


def install_venv(variant: str, extra: str, found: dict[str, str]) -> None:
    """.venv by the venv module of the Python that runs this, then pip."""
    env_dir = ROOT / ".venv"
    python = env_python("venv")

    def build(fresh: bool) -> None:
        if fresh:
            step([sys.executable, "-m", "venv", env_dir.name], dict(os.environ),
                 "creating .venv", "install Python's venv module (python3-venv) or load a "
                 "Python module")  # fmt: skip
        pip_install(python, variant, extra, found, plan_torch(python, variant, found))
        check_installed(python, variant)

    transaction(env_dir, build)


def install_conda(conda: str, variant: str, extra: str, found: dict[str, str]) -> None:
    """.conda from environment.yml (Python and pip), then pip."""
    env_dir = ROOT / ".conda"
    python = env_python("conda")
    fix = "check conda's channels (conda config --show channels) or the site's conda mirror"
    spec = ["--prefix", env_dir.name, "--file", "environment.yml"]

    def build(fresh: bool) -> None:
        if fresh:
            step([conda, "env", "create", *spec], dict(os.environ), "conda env create", fix)
            torch = plan_torch(python, variant, found)
        else:  # torch checked first: an existing environment changes only after the check
            torch = plan_torch(python, variant, found)
            step([conda, "env", "update", *spec, "--prune"], dict(os.environ),
                 "conda env update", fix)  # fmt: skip
        pip_install(python, variant, extra, found, torch)
        check_installed(python, variant)

    transaction(env_dir, build)


def uv_env(variant: str, found: dict[str, str]) -> dict[str, str]:
    """The environment of uv for the settings.

    A mirror goes to uv's own variables; the wheel folder is uv's cache, read offline (uv.lock
    names each file's source, which a plain folder of wheels cannot stand in for).
    """
    env = dict(os.environ)
    if "PIP_INDEX_URL" in found:
        env["UV_DEFAULT_INDEX"] = found["PIP_INDEX_URL"]
    if "TORCH_INDEX" in found:  # before the UV_INDEX entries of the environment, if any
        named = f"pytorch-{variant}={found['TORCH_INDEX']}"
        env["UV_INDEX"] = f"{named} {env.get('UV_INDEX', '')}".strip()
    if "WHEELS" in found:
        env.update(UV_CACHE_DIR=found["WHEELS"], UV_OFFLINE="1", UV_LINK_MODE="copy")
    return env


def uv_command(uv: str, python_version: str, variant: str, extra: str) -> list[str]:
    """`uv sync` with the variant's torch and the chosen extra (dev tools: uv's default)."""
    return [uv, "sync", "--python", python_version, "--extra", variant] + (
        ["--extra", extra] if extra else []
    )


def torch_indexes(env: dict[str, str]) -> dict[str, str]:
    """PyTorch's wheel indexes that uv reads torch from, by name, as UV_INDEX may replace them.

    pyproject.toml names one a torch build (``pytorch-<variant>``); read with a pattern, as
    Python 3.10 has no TOML reader before the environment exists.
    """
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    found = dict(UV_TORCH_INDEX.findall(text))
    replaced: dict[str, str] = {}
    for entry in env.get("UV_INDEX", "").split():
        name, _, url = entry.partition("=")
        replaced.setdefault(name, url)  # the first of a name is the one uv takes
    return {name: replaced.get(name) or url for name, url in found.items()}


def other_index(output: list[str], variant: str, env: dict[str, str]) -> tuple[str, str] | None:
    """The index of another torch build that failed uv's output names (name, URL), if one did."""
    for name, url in torch_indexes(env).items():
        if name != f"pytorch-{variant}" and any(url.rstrip("/") in line for line in output):
            return name, url
    return None


def uv_sync(uv: str, python_version: str, variant: str, extra: str, env: dict[str, str]) -> None:
    """.venv as uv.lock says, with the variant's torch and the chosen extra.

    uv.lock holds torch of every build that pyproject.toml names, so that one lock serves the
    laptop, CI and the cluster: making or updating it reads every build's index, while an
    install from a current lock reads the variant's alone. A lock made where another build's
    index does not answer fails; the line says so and names the ways out.
    """
    env_dir = ROOT / ".venv"
    fix = FIX["wheels" if env.get("UV_OFFLINE") else "index"]

    def build(_fresh: bool) -> None:
        try:
            step(uv_command(uv, python_version, variant, extra), env, "uv sync", fix)
        except StepError as err:
            if (other := other_index(err.output, variant, env)) is None:
                raise
            name, url = other
            raise InstallError(
                f"uv sync failed ({err.reason}): uv.lock holds every torch build that "
                f"pyproject.toml names, so making or updating it reads {url} ({name}) too; make "
                "uv.lock where that index answers and commit it (an install from a current "
                f"uv.lock reads the {variant} index alone), or name a mirror of it in the "
                f"environment: UV_INDEX={name}=<url>"
            ) from None
        check_installed(env_python("uv"), variant)

    transaction(env_dir, build)


def build_requires() -> list[str]:
    """pyproject.toml's build requirements (an editable install builds with them).

    Python 3.10 has no TOML reader before the environment exists (tomli is one of the
    project's dependencies): there the `requires` line of [build-system] is read as written.
    """
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    try:
        import tomllib  # noqa: PLC0415
    except ModuleNotFoundError:
        section = text.partition("[build-system]")[2]
        listed = re.search(r"^requires\s*=\s*\[([^\]]*)\]", section, re.M)
        return re.findall(r"[\"']([^\"']+)[\"']", listed[1]) if listed else []
    return list(tomllib.loads(text)["build-system"]["requires"])


def downloader(route: str, found: dict[str, str], scratch: Path) -> str:
    """A Python whose pip downloads dependency groups (25.1+), for this platform and Python.

    The Python that runs this where its pip is new enough, else the environment's; else (a
    fresh project, whose system Python brings an older pip or none) a throwaway venv in
    `scratch` made by this Python, its pip upgraded from the package index: `make wheels`
    runs where there is internet, and needs nothing installed first.
    """
    for python in (sys.executable, env_python(route)):
        if pip_version(python) >= GROUP_PIP:
            return python
    venv = scratch / "pip"
    step([sys.executable, "-m", "venv", str(venv)], dict(os.environ),
         "creating a throwaway venv for pip", "install Python's venv module (python3-venv) "
         "or load a Python module")  # fmt: skip
    python = str(venv / "bin" / "python")
    args, env = pip_sources(found)
    step([python, "-m", "pip", "install", "--quiet", "--upgrade", *args, "pip>=25.1"], env,
         "upgrading its pip", FIX["index"])  # fmt: skip
    return python


def download(route: str, variant: str, extra: str, found: dict[str, str], into: Path) -> None:
    """Every wheel `make install` takes, for this platform and Python, into a folder."""
    with tempfile.TemporaryDirectory(prefix="make-wheels-") as scratch:
        fetch(downloader(route, found, Path(scratch)), variant, extra, found, into)


def fetch(python: str, variant: str, extra: str, found: dict[str, str], into: Path) -> None:
    """Download with `python`'s pip: torch of the variant, then the project's packages."""
    into.mkdir(parents=True, exist_ok=True)
    version = torch_choice(python, variant, found)
    torch_args, torch_env = torch_sources(variant, found)
    get_torch = [python, "-m", "pip", "download", "--dest", str(into), "--no-deps", *torch_args]
    step([*get_torch, f"torch=={version}"], torch_env, f"downloading torch {version}",
         FIX["index"])  # fmt: skip
    args, env = pip_sources(found)
    # The project's dependencies with that torch (its find-links copy: the local label sorts
    # above PyPI's build of the same version), pip itself and the build backend.
    step([python, "-m", "pip", "download", "--dest", str(into), *args, "--find-links",
          str(into), project(extra), "--group", "dev", f"torch=={version}", "pip>=25.1",
          *build_requires()], env, "downloading the project's packages", FIX["index"])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Build the environment (or fill WHEELS); 1 and one line on stderr when a step fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("route", choices=["venv", "conda", "uv"])
    parser.add_argument("--variant", required=True, help="cpu, cu126, ...: torch's label")
    parser.add_argument("--extra", default="", help="the project's extra to install with it")
    parser.add_argument("--conda", default="conda", help="conda or mamba")
    parser.add_argument("--uv", default="uv")
    parser.add_argument("--python-version", default="", help="uv: the Python to use")
    parser.add_argument("--download", action="store_true", help="make wheels: fill WHEELS")
    args = parser.parse_args(argv)
    found = settings()
    target = "make wheels" if args.download else "make install"
    try:
        if args.download:
            into = Path(found.pop("WHEELS", str(ROOT / "wheels")))
            make_wheels(args, found, into)
        elif args.route == "venv":
            install_venv(args.variant, args.extra, found)
        elif args.route == "conda":
            install_conda(args.conda, args.variant, args.extra, found)
        else:
            uv_sync(args.uv, args.python_version, args.variant, args.extra,
                    uv_env(args.variant, found))  # fmt: skip
    except InstallError as err:
        print(f"{target}: {err}", file=sys.stderr)
        return 1
    if args.download:
        print(f"{target}: {into} holds what {make_line('install', args.variant)} takes here; on a "
              f"machine without internet (same platform and Python) name it as WHEELS={into} "
              "in .env, then run that install")  # fmt: skip
    else:
        python = env_python(args.route)
        print(f"{target}: done, torch {installed_torch(python)} in {Path(python).parents[1]}/")
    return 0


def make_wheels(args: argparse.Namespace, found: dict[str, str], into: Path) -> None:
    """`make wheels`: pip's folder of wheels, or uv's cache, filled from the network."""
    if args.route == "uv":  # a sync into a scratch environment downloads every package
        with tempfile.TemporaryDirectory() as scratch:
            env = uv_env(args.variant, found)
            env |= {"UV_CACHE_DIR": str(into), "UV_PROJECT_ENVIRONMENT": scratch}
            command = uv_command(args.uv, args.python_version, args.variant, args.extra)
            step(command, env, "uv sync into uv's cache", FIX["index"])
    else:
        download(args.route, args.variant, args.extra, found, into)


if __name__ == "__main__":
    sys.exit(main())
