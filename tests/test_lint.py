"""The template's own code meets the same bar as the generated code."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engines import BIN

ROOT = Path(__file__).resolve().parent.parent
# Explicit folders: the generated project's folder holds templates, linted after baking.
OWN_CODE = ["hooks", "tools", "tests"]


def test_ruff_check_and_format() -> None:
    for args in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [str(BIN / "ruff"), *args, "--no-cache", *OWN_CODE],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:]


def test_ci_script_passes_shellcheck() -> None:
    done = subprocess.run(
        [str(BIN / "shellcheck"), ".ci/run"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout
