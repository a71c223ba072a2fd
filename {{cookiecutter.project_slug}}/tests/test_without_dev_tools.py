"""Without the dev group: plain `pytest` skips what needs it, saying why; benchmarks run.

The dev group's packages are made unimportable in a child process (its plugins left out, as
pytest would not find them), and the suite is collected there. The benchmarks need neither
pytest nor the rest (the GPU day runs them in an environment of the package alone).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEV_ONLY, ROOT, cli_env

DEV_PACKAGES = ("hypothesis", "nbclient", "nbformat", "jupyter_client", "xdist", "ipykernel")
ABSENT = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {absent!r}:
            raise ModuleNotFoundError("No module named " + repr(name))
sys.meta_path.insert(0, Absent())
"""
# For the benchmarks, as if never installed: a None in sys.modules makes `import` fail with
# ModuleNotFoundError and `importlib.util.find_spec` return None, which torch's compiler
# asks of hypothesis (pytest's collection cannot take it: the finder above serves there).
MISSING = """
import sys
sys.modules.update(dict.fromkeys({absent!r}))
"""
COLLECT = (
    ABSENT.format(absent=DEV_PACKAGES)
    + """
import pytest
plugins = ["no:cacheprovider", "no:xdist", "no:hypothesispytest"]
sys.exit(pytest.main(["--collect-only", "-q", "-rs", *(a for p in plugins for a in ("-p", p))]))
"""
)
BENCHMARK = (
    MISSING.format(absent=(*DEV_PACKAGES, "pytest", "_pytest"))
    + """
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
)
# Every benchmark's --help in one process (one start of torch, not one per script): its exit
# status and what it printed, as JSON a line each.
HELPS = (
    MISSING.format(absent=(*DEV_PACKAGES, "pytest", "_pytest"))
    + """
import contextlib, io, json, runpy
for script in sys.argv[1:]:
    sys.argv, out, code = [script, "--help"], io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as done:
            code = done.code
    print(json.dumps({"script": script, "code": code, "out": out.getvalue()}), flush=True)
"""
)
SCRIPTS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -c code args...` in the project, its package importable."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=cli_env(ROOT),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_suite_collects_without_the_dev_group() -> None:
    done = python(COLLECT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skipped = {
        line.split()[2].split(":")[0]
        for line in done.stdout.splitlines()
        if line.startswith("SKIPPED") and line.endswith(DEV_ONLY)
    }
    assert {"tests/test_damaged_files.py", "tests/test_notebook.py"} <= skipped, done.stdout
    assert "tests/test_stream_properties.py" in skipped, done.stdout
    assert "tests/test_streams.py::" in done.stdout  # the streams' other tests still run


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """What each benchmark's --help did, by script path."""
    done = python(HELPS, *map(str, SCRIPTS))
    assert done.returncode == 0, done.stderr[-3000:]
    said = [json.loads(line) for line in done.stdout.splitlines()]
    return {entry["script"]: entry for entry in said}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_benchmark_runs_without_pytest(helps: dict[str, dict], script: Path) -> None:
    entry = helps[str(script)]
    assert entry["code"] == 0, entry
    assert entry["out"].startswith("usage: "), entry["out"][:500]


@pytest.mark.slow  # half a minute: a ddp and an fsdp save and load, each profiled
def test_the_checkpoint_benchmark_measures_without_pytest() -> None:
    """Not only its help: a whole run, small, with the test task it builds (toy_tasks.tower)."""
    tiny = ("--gib", "0.002", "--width", "64", "--rounds", "1", "--plan-mb", "2")
    done = python(BENCHMARK, str(ROOT / "benchmarks" / "bench_checkpoint.py"), *tiny)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith("checkpoint: 1x ddp ") and " | 1x fsdp " in last, done.stdout[-2000:]
    assert "profile of one load" in done.stdout
