"""`pip install -e .` without the dev group, then plain `pytest`: skips that say why, no error.

The dev group's packages are made unimportable in a child process (its plugins left out, as
pytest would not find them), and the suite is collected there.
"""

import subprocess
import sys

from conftest import DEV_ONLY, ROOT, cli_env

DEV_PACKAGES = ("hypothesis", "nbclient", "nbformat", "jupyter_client", "xdist", "ipykernel")
COLLECT = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {DEV_PACKAGES!r}:
            raise ModuleNotFoundError("No module named " + repr(name))
sys.meta_path.insert(0, Absent())
import pytest
plugins = ["no:cacheprovider", "no:xdist", "no:hypothesispytest"]
sys.exit(pytest.main(["--collect-only", "-q", "-rs", *(a for p in plugins for a in ("-p", p))]))
"""


def test_the_suite_collects_without_the_dev_group() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT],
        cwd=ROOT,
        env=cli_env(ROOT),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skipped = {
        line.split()[2].split(":")[0]
        for line in done.stdout.splitlines()
        if line.startswith("SKIPPED") and line.endswith(DEV_ONLY)
    }
    assert {"tests/test_damaged_files.py", "tests/test_notebook.py"} <= skipped, done.stdout
    assert "tests/test_stream_properties.py" in skipped, done.stdout
    assert "tests/test_streams.py::" in done.stdout  # the streams' other tests still run
