"""When packing small runs onto one GPU pays, judged from what earlier runs recorded.

A run on a GPU writes into its `summary.json` its samples/s, the mean GPU utilisation of NVML
samples taken at logging steps (`gpu_util_mean_pct`, where nvidia-ml-py is installed) and its
peak GPU memory. A run that keeps its GPU busy less than half of the time leaves room for
another: K such runs side by side (slurm/pack.sbatch) share the GPU's time and memory, and on
a partition charged per GPU each costs 1/K of one. How much the packing gained is measured,
not assumed: a packed run's summary says how many shared the GPU (`packed_runs`), and K times
its samples/s against a run alone is the gain.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A run that keeps the GPU busy at least this share of the time gains little from company:
# its kernels would mostly wait for the others' (without MPS the GPU runs one process's
# kernels at a time).
BUSY_PCT = 50.0
# The share of the GPU's memory all packed runs together may take (the rest: each process's
# CUDA context, fragmentation, a validation batch larger than a training one).
MEMORY_SHARE = 0.8
# More processes than this per GPU: their CUDA contexts and the switching between them cost
# more than another run gains; start the rest as further jobs.
MOST = 8


@dataclass
class Trial:
    """What one run's summary says about its use of a GPU."""

    name: str
    samples_per_s: float
    util_pct: float | None  # None: NVML was not available
    peak_gib: float
    packed_runs: int


def trials(runs_dir: Path) -> list[Trial]:
    """The runs below `runs_dir` that trained on a GPU, newest summary first."""
    found: list[tuple[float, Trial]] = []
    for path in runs_dir.glob("*/summary.json") if runs_dir.is_dir() else []:
        try:
            summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if "peak_gpu_mem_gib" not in summary:
            continue  # trained on the CPU (or an older run): nothing to judge
        trial = Trial(
            name=path.parent.name,
            samples_per_s=float(summary.get("samples_per_s", 0.0)),
            util_pct=summary.get("gpu_util_mean_pct"),
            peak_gib=float(summary["peak_gpu_mem_gib"]),
            packed_runs=int(summary.get("packed_runs", 1)),
        )
        found.append((path.stat().st_mtime, trial))
    return [t for _, t in sorted(found, key=lambda item: -item[0])]


def pack_size(util_pct: float, peak_gib: float, gpu_gb: float) -> int:
    """Runs per GPU: as many as fit into its time (utilisation) and memory, at most MOST."""
    by_time = math.floor(100.0 / max(util_pct, 1.0))
    by_memory = math.floor(MEMORY_SHARE * gpu_gb * 1e9 / 2**30 / max(peak_gib, 0.01))
    return max(1, min(by_time, by_memory if gpu_gb > 0 else by_time, MOST))


def advice(found: list[Trial], gpu_gb: float) -> list[str]:
    """What the runs say about packing: a suggested K, and the measured gain of packed runs."""
    alone = [t for t in found if t.packed_runs == 1]
    packed = [t for t in found if t.packed_runs > 1]
    lines = []
    if alone:
        trial = alone[0]
        if trial.util_pct is None:
            lines.append(
                f"run {trial.name} recorded no GPU utilisation (NVML: pip install nvidia-ml-py); "
                "without it, pack only runs that measured well under 50 %"
            )
        elif trial.util_pct >= BUSY_PCT:
            lines.append(
                f"run {trial.name} kept the GPU {trial.util_pct:.0f} % busy: one run per GPU "
                "(packing pays below 50 %)"
            )
        elif (k := pack_size(trial.util_pct, trial.peak_gib, gpu_gb)) > 1:
            memory = f" of {gpu_gb:g} GB" if gpu_gb else ""
            lines.append(
                f"run {trial.name} kept the GPU {trial.util_pct:.0f} % busy with "
                f"{trial.peak_gib:.2f} GiB{memory}: packing pays, up to {k} runs per GPU "
                f"(sbatch --export=ALL,PACK_SIZE={k} slurm/pack.sbatch), or a MIG slice"
            )
        else:
            lines.append(
                f"run {trial.name} needs {trial.peak_gib:.2f} GiB of the GPU's memory: "
                "no second run fits beside it"
            )
    if alone and packed and alone[0].samples_per_s > 0:
        trial = packed[0]
        gain = trial.packed_runs * trial.samples_per_s / alone[0].samples_per_s
        lines.append(
            f"measured: {trial.packed_runs} packed runs ({trial.name}: {trial.samples_per_s:.0f} "
            f"samples/s each) trained {gain:.2f}x the samples/s of run {alone[0].name} alone "
            f"({alone[0].samples_per_s:.0f})"
            + ("" if gain > 1.1 else ": packing does not pay for these runs")
        )
    return lines
