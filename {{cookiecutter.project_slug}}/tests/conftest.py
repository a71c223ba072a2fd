"""Shared helpers: the package under test, isolated project folders, small data sets.

The package name is read from pyproject.toml, so these tests stay valid if the project is
renamed. Every test runs with one intra-op thread: the suite runs on small shared CI machines,
where oversubscribed threads slow tiny models down many times.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from under_test import PACKAGE, ROOT, pkg

DIGITS = ROOT / "data" / "raw" / "digits.csv.gz"
CORPUS = ROOT / "data" / "raw" / "corpus.txt"  # the language-model example's text
# The reason a module of tests skips where the dev group is not installed (`pip install -e .`
# alone): Hypothesis, nbclient and their kind come with `pip install -e . --group dev`.
DEV_ONLY = "needs the dev group's tools: pip install -e . --group dev (make install does)"

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def run_cli(
    *args: str,
    project: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    torchrun: int = 0,
) -> subprocess.CompletedProcess[str]:
    """`python -m <package> ...` in a fresh process, with `project` as the project root.

    `torchrun=N` starts N processes on this machine (a free rendezvous port each time).
    A command still running after `timeout` seconds has hung (they take seconds): each
    process it started prints where its threads stand (faulthandler, on SIGABRT), all are
    killed, none is left to load the machine for the tests after it, and the test fails with
    those stacks.
    """
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += [f"--nproc_per_node={torchrun}"] if torchrun else []
    command = [*(launcher if torchrun else [sys.executable]), "-m", PACKAGE, *args]
    with subprocess.Popen(
        command,
        cwd=project,
        env={**cli_env(project, env), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = process_tree(child.pid)  # torchrun's workers run in sessions of their own
            signal_all(hung, signal.SIGABRT)
            try:
                out, err = child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                signal_all(hung, signal.SIGKILL)
                out, err = child.communicate()
            signal_all(hung, signal.SIGKILL)
            pytest.fail(f"{' '.join(args)}: still running after {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(command, child.returncode, out, err)


CliHere = Callable[..., subprocess.CompletedProcess[str]]  # the type of `cli_here`


@pytest.fixture
def cli_here(
    project: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> CliHere:
    """`run_cli` in this process: `cli.main(args)` (what `python -m` calls) from `project`.

    Its exit code and what it printed are the package's own either way, and a process of its
    own costs seconds to start (torch, the package; a stream's fork server). The output is
    taken from the file descriptors, so a DataLoader worker forked here is heard too. A
    stream's workers are forked by the fork server that the first stream of this pytest
    process started, so what they print is not heard (run_cli hears every process).
    """

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(project)
        capfd.readouterr()  # what the test printed before
        code = pkg("cli").main(list(args))
        out = capfd.readouterr()
        return subprocess.CompletedProcess(["cli.main", *args], code, out.out, out.err)

    return run


def run_ranks(project: Path, *args: str, n: int = 2) -> list[subprocess.CompletedProcess[str]]:
    """`python -m <package> ...` as `n` processes that meet over TCP, as srun starts them.

    Each rank is a process of its own with its own output (no torchrun, whose own report of a
    failed rank would follow theirs). A rank still running after 600 s has hung: all are
    killed and the test fails.
    """
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    command, children = [sys.executable, "-m", PACKAGE, *args], []
    for rank in range(n):
        env = cli_env(project, {"RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_PORT": port})
        env.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1")
        children.append(
            subprocess.Popen(
                command,
                cwd=project,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for child in children:
        try:
            out, err = child.communicate(timeout=600)  # a hang guard: they take seconds
        except subprocess.TimeoutExpired:
            signal_all([each.pid for each in children], signal.SIGKILL)
            pytest.fail(f"{' '.join(args)}: a rank still ran after 600 s")
        done.append(subprocess.CompletedProcess(command, child.returncode, out, err))
    return done


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (from Linux's /proc; elsewhere `pid` alone)."""
    below: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone while read
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            below.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += below.get(tree[-1], [])
    return tree


def signal_all(pids: list[int], signum: int) -> None:
    """Send `signum` to each process of `pids` that still runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def cli_env(project: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process: package importable, paths below `project`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK"))}
    env.update(
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
        ),
        PROJECT_ROOT=str(project),
        OMP_NUM_THREADS="1",
        RUN_NAME="",
    )
    env.update(extra or {})
    return env


def blobs(*overrides: str, **options: object):
    """The test task `toy_tasks.blobs` with a configuration from `overrides` and `options`.

    Its data is made in memory, so it trains without `prepare` or any data/raw files.
    """
    settings = pkg("settings")
    task_keys = [f"task.{key}={value}" for key, value in options.items()]
    cfg = pkg("task").load_config(None, ["task.name=toy_tasks.blobs", *task_keys, *overrides])
    return pkg("task").load_task(cfg, settings.get_settings())


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project root (data/, runs/, reports/ are created below it on demand)."""
    # The library caches too: settings.py places them below the DATA_DIR of the first project.
    caches = pkg("settings").CACHE_VARS
    for var in ("DATA_DIR", "RUNS_DIR", "RUN_NAME", "LOCAL_TMPDIR", *caches):
        monkeypatch.delenv(var, raising=False)
    for var in list(os.environ):
        if var.startswith("SLURM_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    return tmp_path


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model weights of a run's newest checkpoint."""
    state = pkg("engine.state.checkpoint").load_latest(run_dir / "checkpoints")
    assert state is not None, f"no checkpoint in {run_dir}"
    return state["model"]


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-identical weights, tensor by tensor."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


# The example tasks the template ships, and the raw file each reads.
EXAMPLE_RAW = {
    "digits": DIGITS,
    "images": DIGITS,
    "stream": DIGITS,
    "regression": DIGITS,
    "lm": CORPUS,
    "hub_lm": CORPUS,
}


def example_task(name: str) -> bool:
    """True while the shipped example (its task module and raw file) is in the project."""
    raw = EXAMPLE_RAW.get(name, DIGITS)
    return raw.is_file() and (ROOT / "src" / PACKAGE / "tasks" / f"{name}.py").is_file()


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The matplotlib figures drawn while the test runs, left open to be read, then closed."""
    plt = pkg("observe.plots")._pyplot()
    close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", figures.append)
    yield figures
    for figure in figures:
        close(figure)


@pytest.fixture
def digits_project(project: Path) -> Path:
    """A project root whose data/processed holds the prepared digits example."""
    if not example_task("digits"):
        pytest.skip("the digits example is not part of this project (any more)")
    raw = project / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / DIGITS.name).write_bytes(DIGITS.read_bytes())
    cfg = pkg("task").load_config(None, ["data.verify_raw=false", "task.name=digits"])
    pkg("data.processed").prepare(pkg("task").load_task(cfg, pkg("settings").get_settings()))
    return project
