"""The generated multi-node job on a real two-node Slurm: two slurmd on this machine.

Debian's slurmd is built with MULTIPLE_SLURMD, so `slurmd -N node1` and `slurmd -N node2` act as
two nodes (own names, ports, spool dirs; shared network namespace, so gloo talks over
loopback). A project baked with nodes=2 and one GPU per node trains with gloo on the CPU:
rank 0 on node1, rank 1 on node2.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import ROOT, bake
from slurm.localslurm import LocalSlurm, load_presets, temporary_cluster
from slurm.project import (
    JobProject,
    make_venv,
    max_difference,
    require_slurm,
    resumed_step,
    same_weights,
)

pytestmark = pytest.mark.slurm

PRESETS = load_presets(ROOT / "presets")
# Two ranks with 64 samples each against one process with 128: the same global batch. Rank r
# takes every other sample of the epoch's permutation, so each step averages the gradient of
# exactly the samples the single process sees in that step. Dropout is off because each rank
# draws its own dropout masks. What remains is the order of floating-point sums.
DDP_RUN = ("train.epochs=3", "model.dropout=0", "run.figures=false", "dist.timeout_minutes=2")
# A rank that waits longer than this prints its stack into the job log (tests/slurm/probe.py).
HANG = {"PROBE_HANG_DUMP": "100"}
# Observed: ~1e-7; the bound leaves room for other CPUs' summation order, far below the
# weight changes training makes (~1e-2).
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    require_slurm()
    with temporary_cluster(
        "slurm-2nodes-", nodes=["node1", "node2"]
    ) as instance:  # shaped by the presets
        yield instance


@pytest.fixture(scope="module")
def project(cluster: LocalSlurm, template: Path, tmp_path_factory) -> JobProject:
    answers = {"nodes": "2", "gpus_per_node": "1"}
    baked = bake("cookiecutter", template, tmp_path_factory.mktemp("slurm-2nodes"), answers)
    assert baked.ok, baked.stderr
    make_venv(baked.project)
    proj = JobProject(baked.project, cluster)
    proj.cli("prepare")
    return proj


def _two_node_run(project: JobProject, tmp: Path, name: str, **env: str) -> tuple[str, dict]:
    """Submit the generated job for run `name`; return its log and each rank's weights."""
    import torch  # noqa: PLC0415 - heavy, only here

    probe = tmp / name
    job = project.sbatch(
        "slurm/train.sbatch",
        *DDP_RUN,
        "train.batch_size=64",
        f"run.name={name}",
        PROBE_WEIGHTS_DIR=str(probe),
        **HANG,
        **env,
    )
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")
    assert info["JobState"] == "COMPLETED", log
    assert info["NodeList"] == "node[1-2]"
    ranks = {p.name: torch.load(p, weights_only=False) for p in sorted(probe.glob("rank*.pt"))}
    return log, ranks


@pytest.fixture(scope="module")
def srun_run(project: JobProject, tmp_path_factory) -> tuple[str, dict]:
    return _two_node_run(project, tmp_path_factory.mktemp("probe"), "ddp")


def test_ranks_on_both_nodes_end_with_identical_weights(
    project: JobProject, srun_run: tuple[str, dict]
) -> None:
    log, ranks = srun_run
    assert "run ddp: 2 process(es) via slurm" in log
    assert [(r["rank"], r["node"]) for r in ranks.values()] == [(0, "node1"), (1, "node2")]
    assert same_weights(ranks["rank0.pt"]["model"], ranks["rank1.pt"]["model"])
    assert same_weights(ranks["rank0.pt"]["model"], project.final_weights("ddp"))


def test_two_nodes_match_one_process_with_the_same_global_batch(
    project: JobProject, srun_run: tuple[str, dict]
) -> None:
    project.cli("train", *DDP_RUN, "train.batch_size=128", "run.name=single")
    ddp, single = project.final_weights("ddp"), project.final_weights("single")
    # How far training moved the weights in its last two epochs (checkpoints every epoch).
    moved = max_difference(single, project.weights(project.checkpoints("single")[0]))
    diff = max_difference(ddp, single)
    print(
        f"\n2 ranks vs 1 process: max |diff| {diff:.2e} (last 2 epochs moved weights {moved:.2e})"
    )
    assert diff <= TOLERANCE < moved


def test_torchrun_variant_trains_the_same(
    project: JobProject, srun_run: tuple[str, dict], tmp_path: Path
) -> None:
    log, ranks = _two_node_run(project, tmp_path, "ddp-torchrun", LAUNCHER="torchrun")
    # --max-restarts: torchrun restarts its workers after a transient failure (RETRIES, 2).
    launch = "torch.distributed.run --nnodes=2 --nproc-per-node=1 --max-restarts=2"
    assert f"{launch} --rdzv-backend=c10d" in log
    assert "run ddp-torchrun: 2 process(es) via torchrun" in log
    assert {r["node"] for r in ranks.values()} == {"node1", "node2"}
    assert same_weights(ranks["rank0.pt"]["model"], ranks["rank1.pt"]["model"])
    reference = project.final_weights("ddp")
    assert max_difference(project.final_weights("ddp-torchrun"), reference) <= TOLERANCE


def test_two_node_job_requeues_and_resumes_identically(
    project: JobProject, srun_run: tuple[str, dict]
) -> None:
    job = project.sbatch(
        "slurm/train.sbatch",
        *DDP_RUN,
        "train.batch_size=64",
        "run.name=ddp-requeue",
        PROBE_STEP_DELAY="0.5",
        **HANG,
    )
    name = f"{project.slug}-{job}"
    project.wait_for("first checkpoint", lambda: project.checkpoints("ddp-requeue"), job)
    project.cluster.run("scancel", "--signal=USR1", "--batch", job)
    info = project.finished(job)
    log = project.log(name)
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "1"
    assert log.count("stop signal (") == 1  # rank 0 reports the agreed stop
    assert 0 < resumed_step(log) < 33
    assert same_weights(project.final_weights("ddp-requeue"), project.final_weights("ddp"))


def test_a_dead_rank_ends_the_job_on_every_node_within_a_minute(project: JobProject) -> None:
    # Rank 1 (node2) dies mid-training; rank 0 (node1) then waits in an all-reduce that never
    # completes. With a 10-minute distributed timeout, only the launcher's fail-fast (srun
    # --wait=30) can end the job before the generous deadline below.
    job = project.sbatch(
        "slurm/train.sbatch",
        "train.epochs=3",
        "run.figures=false",
        "dist.timeout_minutes=10",
        "run.name=ddp-dead",
        PROBE_DIE="1:5",
    )
    name = f"{project.slug}-{job}"
    project.wait_for("the rank's death", lambda: "probe: rank 1 dies" in project.log(name), job)
    died = time.monotonic()
    info = project.finished(job, 420)  # well below the 10-minute timeout
    ended_after = time.monotonic() - died
    log = project.log(name)
    print(f"\njob ended {ended_after:.0f} s after rank 1 died")
    assert (info["JobState"], info["Restarts"]) == ("FAILED", "0"), log
    assert info["ExitCode"] != "0:0"
    assert "requeueing" not in log


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_sbatch_test_only_accepts_two_node_scripts(
    cluster: LocalSlurm, template: Path, tmp_path: Path, preset: str
) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"cluster": preset, "nodes": "2"})
    assert baked.ok, baked.stderr
    for script in sorted((baked.project / "slurm").glob("*.sbatch")):
        res = cluster.run("sbatch", "--test-only", str(script), cwd=baked.project, check=False)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"
        if script.name == "pack.sbatch":  # small runs share one GPU: one node by design
            assert "on nodes node1 " in res.stderr or "on nodes node2 " in res.stderr, res.stderr
        else:
            assert "node1,node2" in res.stderr or "node[1-2]" in res.stderr, res.stderr
