"""The GPU day's script runs end to end at toy sizes on the CPU: it cannot rot between GPU days."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, cli_env


@pytest.mark.slow
def test_gpu_day_runs_every_step_tiny_and_gathers_its_figures(tmp_path: Path) -> None:
    env = cli_env(ROOT)
    env["PROJECT_ROOT"] = str(tmp_path)  # the benchmarks' runs go there, not into runs/
    env["PYTHON"] = sys.executable
    before = set((ROOT / "reports").glob("gpu-day-*.txt"))
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_day.sh"), "--tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    made = set((ROOT / "reports").glob("gpu-day-*.txt")) - before
    text = "".join(path.read_text(encoding="utf-8") for path in made)
    for path in made:  # the results file of this run: not left in the project
        path.unlink()
    (results,) = made
    assert done.returncode == 0, text[-4000:] + done.stderr[-2000:]
    figures = text.split("== figures\n")[-1].splitlines()
    for prefix in ("trainer/raw: mlp=", "lm: ", "checkpoint: 1x ddp "):
        assert any(line.startswith(prefix) for line in figures), figures
    lm = next(line for line in figures if line.startswith("lm: "))
    assert "eager trainer/raw=" in lm and "compiled trainer/raw=" in lm and "mfu=" in lm
    if importlib.util.find_spec("transformers") is None:  # the hub step needs the hf extra
        assert "== hub: skipped, the hf extra is not installed" in text
    else:  # the export read back by transformers: every key, the embeddings still tied
        hub = next(line for line in figures if line.startswith("hub: "))
        assert "fsdp on cpu" in hub and "missing=0 unexpected=0 tied=yes" in hub, hub
    assert done.stdout.rstrip().endswith(f"results: {results.relative_to(ROOT)}")
