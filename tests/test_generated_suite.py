"""The default project's own test suite passes, run the way its users run it."""

from __future__ import annotations

import os
import subprocess
import sys

from engines import Bake


def test_default_project_suite_passes(default_bake: Bake) -> None:
    project = default_bake.project
    # The project is not installed into this environment: `src` on the path stands in for
    # `pip install -e .`, which would only add the same files.
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]
