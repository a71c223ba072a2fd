"""Without the dev group: plain `pytest` skips what needs it, saying why; benchmarks run.

The dev group's packages are made unimportable in a child process (its plugins left out, as
pytest would not find them), and the suite is collected there. The benchmarks need neither
pytest nor the rest (the GPU day runs them in an environment of the package alone).
"""

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


@pytest.mark.parametrize("script", sorted((ROOT / "benchmarks").glob("bench_*.py")), ids=str)
def test_a_benchmark_runs_without_pytest(script: Path) -> None:
    done = python(BENCHMARK, str(script), "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]


def test_the_checkpoint_benchmark_measures_without_pytest() -> None:
    """Not only its help: a whole run, small, with the test task it builds (toy_tasks.tower)."""
    tiny = ("--gib", "0.002", "--width", "64", "--rounds", "1", "--plan-mb", "2")
    done = python(BENCHMARK, str(ROOT / "benchmarks" / "bench_checkpoint.py"), *tiny)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.splitlines()[-1]
    assert last.startswith("checkpoint: 1x ddp ") and " | 1x fsdp " in last, done.stdout[-2000:]
    assert "profile of one load" in done.stdout
