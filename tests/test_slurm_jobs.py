"""The generated job scripts on a real one-node Slurm (Debian's slurmctld/slurmd + munge).

The node is declared like a GPU node (64 CPUs, 8 fake A100 and 8 fake MIG GPUs) and carries
every partition of every preset, so the scripts run with their generated headers unchanged.
Training runs on the CPU (torch finds no CUDA device behind the fake GPUs). Timings of the
requeue round trips are printed (run with -s to see them).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import ROOT, bake
from slurm.localslurm import LocalSlurm, load_presets, temporary_cluster
from slurm.project import JobProject, make_venv, require_slurm, resumed_step, same_weights

pytestmark = pytest.mark.slurm

PRESETS = load_presets(ROOT / "presets")
# The runs compared with each other: small, but long enough for a signal to land mid-run.
SIGNAL_RUN = ("train.epochs=20", "run.figures=false")
# A probe-slowed first attempt (0.5 s per step, no CPU used): 220 steps would take 110 s.
SLOW = {"PROBE_STEP_DELAY": "0.5"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    require_slurm()
    with temporary_cluster("slurm-jobs-") as instance:  # shaped by the presets
        yield instance


@pytest.fixture(scope="module")
def project(cluster: LocalSlurm, template: Path, tmp_path_factory) -> JobProject:
    """The default bake with its venv and prepared data, as after `make install data`."""
    baked = bake("cookiecutter", template, tmp_path_factory.mktemp("slurm-default"), {})
    assert baked.ok, baked.stderr
    make_venv(baked.project)
    proj = JobProject(baked.project, cluster)
    proj.cli("prepare")
    return proj


@pytest.fixture(scope="module")
def reference(project: JobProject) -> dict:
    """Final weights of the signal runs' configuration, trained by one unsignalled job."""
    job = project.sbatch("slurm/train.sbatch", *SIGNAL_RUN, "run.name=reference")
    info = project.finished(job)
    assert info["JobState"] == "COMPLETED", project.log(f"{project.slug}-{job}")
    return project.final_weights("reference")


def test_train_job_completes_with_documented_outputs(project: JobProject) -> None:
    job = project.sbatch("slurm/train.sbatch", "train.epochs=2")
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")  # logs/%x-%j.out
    assert info["JobState"] == "COMPLETED", log
    assert info["ExitCode"] == "0:0"
    # The generated headers took effect: partition, one fake A100, requeue, append.
    assert info["Partition"] == "grete:shared"  # the preset's batch partition
    assert info["TresPerNode"] == "gres:gpu:A100:1"
    assert info["Requeue"] == "1"
    assert "training step ended with exit code 0" in log
    assert "via single, device cpu" in log  # the CPU fallback behind a fake GPU
    assert "LOCAL_TMPDIR is unset or not a directory" in log  # staging falls back, visibly
    assert re.search(r"efficiency: segment 0 of job \d+: elapsed \d+h\d+m\d+s, 1 GPU", log)
    assert "no accounting records" in log  # this cluster keeps none; sites with sacct do
    run = project.path / "runs" / job  # run name = job id
    assert (run / "config.toml").is_file()
    assert project.checkpoints(job)
    assert (run / "metrics.csv").read_text().count("\n") > 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["step"] == summary["total_steps"] > 0
    assert list((project.path / "reports" / "figures" / job).glob("*.png"))
    (origin,) = [json.loads(ln) for ln in (run / "provenance.jsonl").read_text().splitlines()]
    assert origin["slurm"]["SLURM_JOB_ID"] == job
    assert origin["raw_manifest_sha256"] and origin["versions"]["torch"]


def test_cpu_only_command_from_the_header_runs_without_a_gpu(project: JobProject) -> None:
    header = (project.path / "slurm" / "train.sbatch").read_text().splitlines()
    line = next(ln for ln in header if "without a GPU" in ln)
    command = line.split(":", 1)[1].split()
    assert command[:1] == ["sbatch"] and "slurm/train.sbatch" in command
    job = project.sbatch(*command[1:])
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")
    assert info["JobState"] == "COMPLETED", log
    assert info.get("TresPerNode", "gres:gpu:0") == "gres:gpu:0"  # no GPU allocated
    assert "device cpu" in log


# Stands in for Apptainer (no container engine here): records its arguments, applies --pwd
# and --env, and runs the command after the image, as `apptainer exec` would inside it.
FAKE_APPTAINER = """#!/bin/bash
echo "$*" >> "$FAKE_APPTAINER_LOG"
[[ "$1" == exec ]] || exit 64
shift
while (($#)); do
    case "$1" in
        --nv) shift ;;
        --bind) shift 2 ;;
        --pwd) cd "$2" && shift 2 ;;
        --env) export "${2?}" && shift 2 ;;
        *.sif) shift && break ;;
        *) echo "fake apptainer: unexpected $1" >&2 && exit 64 ;;
    esac
done
exec "$@"
"""


def test_apptainer_job_runs_python_in_the_image_with_binds(
    cluster: LocalSlurm, template: Path, tmp_path: Path
) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"environment": "apptainer"})
    assert baked.ok, baked.stderr
    make_venv(baked.project)
    proj = JobProject(baked.project, cluster)
    proj.cli("prepare")
    (proj.path / "container" / f"{proj.slug}.sif").touch()
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    calls = tmp_path / "apptainer.log"
    # The image's python: the project venv's (no venv is activated in this environment).
    path = f"{tools}:{proj.python.parent}:{proj.env()['PATH']}"
    job = proj.sbatch(
        "slurm/train.sbatch",
        "train.epochs=1",
        "run.name=boxed",
        "run.figures=false",
        PATH=path,
        FAKE_APPTAINER_LOG=str(calls),
    )
    info = proj.finished(job)
    log = proj.log(f"{proj.slug}-{job}")
    assert info["JobState"] == "COMPLETED", log
    root = proj.path
    assert calls.read_text().split() == [
        "exec",
        "--nv",
        "--bind",
        str(root),
        "--bind",
        f"{root}/data/raw:{root}/data/raw:ro",  # raw data read-only
        "--pwd",
        str(root),
        "--env",
        f"PYTHONPATH={root}/src",
        f"container/{proj.slug}.sif",
        "python",
        "-m",
        proj.slug,
        "train",
        "train.epochs=1",
        "run.name=boxed",
        "run.figures=false",
    ]
    assert json.loads((root / "runs/boxed/summary.json").read_text())["status"] == "finished"


def test_sweep_runs_every_task_with_its_parameters(project: JobProject) -> None:
    lines = [
        ln.split()
        for ln in (project.path / "slurm" / "sweep_params.txt").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    job = project.sbatch("slurm/sweep.sbatch", "train.epochs=1", "run.figures=false")
    assert project.cluster.job(f"{job}_0").get("ArrayTaskThrottle") == "2"
    most_running = 0
    while project.cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip():
        running = project.cluster.run("squeue", "-h", "-j", job, "-t", "R", check=False).stdout
        most_running = max(most_running, len(running.split("\n")) - 1)
        time.sleep(0.2)
    assert 1 <= most_running <= 2  # the %2 throttle
    for task, overrides in enumerate(lines):
        info = project.cluster.job(f"{job}_{task}")
        log = project.log(f"{project.slug}-sweep-{job}_{task}")  # logs/%x-%A_%a.out
        assert info["JobState"] == "COMPLETED", log
        config = tomllib.loads(
            (project.path / "runs" / f"{job}_{task}" / "config.toml").read_text()
        )
        for override in overrides:
            key, value = override.split("=")
            section, name = key.split(".")
            assert config[section][name] == type(config[section][name])(value), (task, key)
        assert f"sweep task {task} of {len(lines)}" in log
        summary = json.loads((project.path / "runs" / f"{job}_{task}" / "summary.json").read_text())
        assert summary["status"] == "finished"


def test_sweep_task_requeues_itself_alone(project: JobProject, tmp_path: Path) -> None:
    params = tmp_path / "two.txt"
    params.write_text("# two tasks\ntrain.lr=0.002\ntrain.lr=0.004\n")
    job = project.sbatch(
        "--array=0-1",
        "slurm/sweep.sbatch",
        "train.epochs=2",
        "run.figures=false",
        SWEEP_FILE=str(params),
        **SLOW,
    )
    project.wait_for("task 1 checkpoint", lambda: project.checkpoints(f"{job}_1"), f"{job}_1")
    project.cluster.run("scancel", "--signal=USR1", "--batch", f"{job}_1")
    project.finished(job)
    logs = [project.log(f"{project.slug}-sweep-{job}_{task}") for task in (0, 1)]
    infos = [project.cluster.job(f"{job}_{task}") for task in (0, 1)]
    assert [i["JobState"] for i in infos] == ["COMPLETED", "COMPLETED"], logs
    assert [i["Restarts"] for i in infos] == ["0", "1"]
    assert f"requeueing {job}_1 (requeue 1 of at most 20)" in logs[1]  # the array task's id
    assert resumed_step(logs[1]) and resumed_step(logs[0]) is None
    # `compare` reports both points: the setting that differs, and the requeued task's two
    # segments added up (each holding the job's one GPU: GPU hours equal wall hours).
    table = compared(project, f"{job}_*")
    assert sorted(row["run"] for row in table) == [f"{job}_0", f"{job}_1"]
    by_run = {row["run"]: row for row in table}
    assert {by_run[f"{job}_{t}"]["train.lr"] for t in (0, 1)} == {"0.002", "0.004"}
    assert [by_run[f"{job}_{t}"]["segments"] for t in (0, 1)] == ["1", "2"]
    for task in (0, 1):
        row = by_run[f"{job}_{task}"]
        summary = json.loads((project.path / "runs" / f"{job}_{task}" / "summary.json").read_text())
        assert row["status"] == "finished" and row["steps"] == row["of steps"] == "22"
        assert float(row["wall h"]) * 3600 == pytest.approx(summary["whole_run"]["wall_s"])
        assert float(row["GPU h"]) == pytest.approx(float(row["wall h"]), rel=1e-3)
    requeued = json.loads((project.path / "runs" / f"{job}_1" / "summary.json").read_text())
    assert requeued["whole_run"]["wall_s"] > requeued["wall_s"]  # both segments counted


def compared(project: JobProject, *runs: str) -> list[dict[str, str]]:
    """`compare RUNS` on the login node; the rows of its CSV, best first."""
    project.cli("compare", *runs, "--name", "slurm-test", "--no-figure")
    with (project.path / "reports" / "slurm-test.csv").open() as f:
        return list(csv.DictReader(f))


def test_packed_runs_share_a_gpu_and_each_resumes_exactly(
    project: JobProject, reference: dict, tmp_path: Path
) -> None:
    # Two runs in one job on one (fake) GPU: the first is the reference's configuration, the
    # second a shorter one with another learning rate. USR1 reaches both; each checkpoints,
    # the job requeues once, and each run resumes from its own checkpoint (the first to the
    # weights of an unbroken run).
    lines = tmp_path / "pack.txt"
    lines.write_text("run.name=pack-a\nrun.name=pack-b train.lr=0.001 train.epochs=4\n")
    job = project.sbatch("slurm/pack.sbatch", *SIGNAL_RUN, PACK_FILE=str(lines), **SLOW)
    for run in ("pack-a", "pack-b"):
        project.wait_for(f"{run}'s checkpoint", lambda r=run: project.checkpoints(r), job)
    project.cluster.run("scancel", "--signal=USR1", "--batch", job)
    info = project.finished(job)
    log = project.log(f"{project.slug}-pack-{job}")
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log
    assert f"requeueing {job} (requeue 1 of at most 20)" in log
    for run, steps in (("pack-a", 220), ("pack-b", 44)):
        found = re.search(rf"^\[{run}\] run {run}: resumed from step (\d+)", log, re.MULTILINE)
        assert found and 0 < int(found[1]) < steps, log
        summary = json.loads((project.path / "runs" / run / "summary.json").read_text())
        assert (summary["status"], summary["step"], summary["gpus"]) == ("finished", steps, 0.5)
    assert "[pack-a] run pack-a: 1 process(es) via single" in log
    assert same_weights(project.final_weights("pack-a"), reference)
    assert not same_weights(project.final_weights("pack-b"), reference)
    table = compared(project, "pack-*")
    assert sorted(row["run"] for row in table) == ["pack-a", "pack-b"]
    for row in table:  # two segments; half a GPU each, all along
        assert row["segments"] == "2" and row["status"] == "finished"
        assert float(row["GPU h"]) == pytest.approx(float(row["wall h"]) / 2, rel=1e-3)


def _submit_sweep(project: JobProject, name: str, text: str, **env: str) -> str:
    """`<slug> sweep FILE` on the "login node"; returns the array job id it printed."""
    space = project.path / "configs" / f"{name}.toml"
    space.write_text(text)
    out = project.cli("sweep", str(space.relative_to(project.path)), **env).stdout
    (job,) = re.findall(r"submitted array job (\d+)", out)
    return job


def test_sweep_command_submits_the_grid_as_one_array(project: JobProject) -> None:
    job = _submit_sweep(
        project,
        "grid",
        '[sweep]\nname = "grid"\n[fixed]\ntrain.epochs = 1\nrun.figures = false\n'
        "[space]\ntrain.lr = [0.002, 0.004]\n",
    )
    assert project.cluster.job(f"{job}_0").get("ArrayTaskThrottle") == "2"
    project.finished(job)
    assert not project.cluster.job(f"{job}_2")  # exactly one task per run
    for task, lr in enumerate((0.002, 0.004)):
        log = project.log(f"{project.slug}-sweep-{job}_{task}")
        assert project.cluster.state(f"{job}_{task}") == "COMPLETED", log
        run = project.path / "runs" / f"grid-00{task}"  # the sweep's names, not job ids
        assert tomllib.loads((run / "config.toml").read_text())["train"]["lr"] == lr
        assert json.loads((run / "summary.json").read_text())["status"] == "finished"


OPTUNA_STUDY = """
[sweep]
name = "opt"
method = "optuna"
trials = 3
concurrency = 1
prune_after = 1
[fixed]
train.epochs = 2
run.val_every_steps = 4
run.checkpoint_every_steps = 4
run.figures = false
[space]
train.lr = {log_uniform = [1e-7, 1e-1]}
# Tried in this order: a good trial, a hopeless one (pruned), the good one again (requeued).
[[enqueue]]
train.lr = 0.01
[[enqueue]]
train.lr = 1e-7
[[enqueue]]
train.lr = 0.01
"""


def test_optuna_study_prunes_requeues_and_completes(project: JobProject) -> None:
    import optuna  # noqa: PLC0415  (the sweep extra: requirements-test.txt has it)

    job = _submit_sweep(project, "opt", OPTUNA_STUDY, **SLOW)
    project.wait_for("trial 2's checkpoint", lambda: project.checkpoints("opt-002"), f"{job}_2")
    project.cluster.run("scancel", "--signal=USR1", "--batch", f"{job}_2")
    project.finished(job)
    logs = [project.log(f"{project.slug}-sweep-{job}_{task}") for task in range(3)]
    infos = [project.cluster.job(f"{job}_{task}") for task in range(3)]
    assert [i["JobState"] for i in infos] == ["COMPLETED"] * 3, logs
    assert [i["Restarts"] for i in infos] == ["0", "0", "1"]
    assert "run opt-001: pruned at step 4" in logs[1]
    assert resumed_step(logs[2]) and "trial 2 -> run opt-002" in logs[2]
    journal = optuna.storages.journal.JournalFileBackend(
        str(project.path / "runs" / ".sweeps" / "opt" / "optuna.journal")
    )
    study = optuna.load_study(study_name="opt", storage=optuna.storages.JournalStorage(journal))
    trials = study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "COMPLETE"]
    # The requeued trial reported to itself what the identical trial 0 did: exact resume.
    assert trials[2].intermediate_values == trials[0].intermediate_values
    assert trials[2].value == trials[0].value


def test_chain_runs_segments_in_order_and_finishes(project: JobProject) -> None:
    res = project.run(
        "slurm/chain.sh",
        "3",
        "run.name=chained",
        "train.epochs=3",
        "run.max_steps_this_segment=11",
        "run.figures=false",
    )
    assert res.returncode == 0, res.stderr
    jobs = res.stdout.split()
    assert len(jobs) == 3 and all(j.isdigit() for j in jobs)
    for before, after in itertools.pairwise(jobs):
        dependency = project.cluster.job(after)["Dependency"]
        assert dependency.startswith(f"afterok:{before}") or dependency == "(null)"
    infos = [project.finished(j) for j in jobs]
    logs = [project.log(f"{project.slug}-{j}") for j in jobs]
    assert [i["JobState"] for i in infos] == ["COMPLETED"] * 3, logs
    # In order: each segment starts once the previous one has ended.
    for prev, nxt in itertools.pairwise(infos):
        assert nxt["StartTime"] >= prev["EndTime"]
    assert [resumed_step(log) for log in logs] == [None, 11, 22]
    assert "segment done at step 11" in logs[0] and "segment done at step 22" in logs[1]
    summary = json.loads((project.path / "runs" / "chained" / "summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("finished", 33)


def test_chain_ends_after_a_failed_segment(project: JobProject) -> None:
    # The first segment fails at once (a bad value); the second must not train on after it.
    res = project.run("slurm/chain.sh", "2", "run.name=broken", "train.epochs=many")
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.split()
    infos = [project.finished(j) for j in (first, second)]
    assert [i["JobState"] for i in infos] == ["FAILED", "CANCELLED"], infos
    assert not (project.path / "logs" / f"{project.slug}-{second}.out").exists()  # never ran


def _wait_resumed(project: JobProject, job: str) -> float:
    start = time.monotonic()
    name = f"{project.slug}-{job}"
    project.wait_for("resume", lambda: resumed_step(project.log(name)) is not None, job)
    return time.monotonic() - start


def test_usr1_checkpoints_requeues_and_resumes_identically(
    project: JobProject, reference: dict
) -> None:
    job = project.sbatch("slurm/train.sbatch", *SIGNAL_RUN, "run.name=usr1", **SLOW)
    name = f"{project.slug}-{job}"
    project.wait_for("first checkpoint", lambda: project.checkpoints("usr1"), job)
    signalled = time.monotonic()
    project.cluster.run("scancel", "--signal=USR1", "--batch", job)
    round_trip = _wait_resumed(project, job)
    info = project.finished(job)
    log = project.log(name)
    print(
        f"\nrequeue round trip (scancel --signal=USR1 -> resumed): {round_trip:.1f} s;"
        f" job total {time.monotonic() - signalled:.1f} s after the signal"
    )
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "1"
    assert "received SIGUSR1" in log
    assert f"requeueing {job} (requeue 1 of at most 20)" in log
    assert "restart 1," in log  # the second start sees SLURM_RESTART_COUNT=1
    assert 0 < resumed_step(log) < 220
    assert same_weights(project.final_weights("usr1"), reference)


def test_time_limit_signal_requeues_and_resumes_identically(
    project: JobProject, reference: dict
) -> None:
    # A real limit given at submit, shorter than the header's: 3 minutes. The job reads it at
    # start and signals itself 60 s before it, while the slowed first attempt (1 s per step,
    # 220 s in all) still runs; the resumed attempt finishes at full speed.
    start = time.monotonic()
    job = project.sbatch(
        "--time=3", "slurm/train.sbatch", *SIGNAL_RUN, "run.name=timelimit", PROBE_STEP_DELAY="1"
    )
    name = f"{project.slug}-{job}"
    project.wait_for("USR1 from the timer", lambda: "received SIGUSR1" in project.log(name), job)
    signal_after = time.monotonic() - start
    round_trip = _wait_resumed(project, job)
    info = project.finished(job)
    log = project.log(name)
    print(f"\ntime-limit signal after {signal_after:.0f} s; requeue round trip {round_trip:.1f} s")
    assert info["JobState"] == "COMPLETED", log
    assert info["Restarts"] == "1"
    assert re.search(r"time left 1[0-9]{2} s: USR1 to stop in [0-9]+ s, 60 s before", log)
    assert "restart 1," in log
    assert 0 < resumed_step(log) < 220
    assert same_weights(project.final_weights("timelimit"), reference)


def test_tar_stream_example_requeues_and_resumes_identically(
    project: JobProject, tmp_path: Path
) -> None:
    """The `stream` example: tar shards staged to the node's disk, two workers, a requeue."""
    args = ("task.name=stream", "train.epochs=3", "run.figures=false", "data.num_workers=2")
    project.cli("prepare", "task.name=stream")
    node_disk = {"LOCAL_TMPDIR": str(tmp_path)}  # the preset's node-local disk variable
    whole = project.sbatch("slurm/train.sbatch", *args, "run.name=tar-whole", **node_disk)
    state, whole_log = project.finished(whole)["JobState"], project.log(f"{project.slug}-{whole}")
    assert state == "COMPLETED", whole_log
    # The first job copies the shards to the node's disk; the next finds that copy intact.
    assert f"staged {project.path / 'data' / 'processed' / 'stream'} -> {tmp_path}" in whole_log
    job = project.sbatch("slurm/train.sbatch", *args, "run.name=tar-cut", **SLOW, **node_disk)
    name = f"{project.slug}-{job}"
    project.wait_for("first checkpoint", lambda: project.checkpoints("tar-cut"), job)
    project.cluster.run("scancel", "--signal=USR1", "--batch", job)
    _wait_resumed(project, job)
    info = project.finished(job)
    log = project.log(name)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert f"LOCAL_TMPDIR={tmp_path} (data is staged there)" in log
    assert "a stream (no planned end)" in log
    assert resumed_step(log) > 0
    assert same_weights(project.final_weights("tar-cut"), project.final_weights("tar-whole"))


def test_limit_too_short_to_train_stops_without_requeue(project: JobProject) -> None:
    # Two minutes leave at most 60 s before a stop signal 60 s ahead of the limit: less than
    # the 120 s a segment needs, so the job ends at once instead of requeueing every minute.
    job = project.sbatch("--time=2", "slurm/train.sbatch", *SIGNAL_RUN, "run.name=tooshort")
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "2:0", "0"), log
    assert "Ask for a longer --time" in log and "Not starting and not requeueing" in log
    assert "launch:" not in log
    assert not (project.path / "runs" / "tooshort").exists()
    assert "efficiency: segment 0 of job" in log  # the end-of-job summary comes anyway


def test_retry_budget_stops_requeueing(project: JobProject) -> None:
    job = project.sbatch(
        "--export=ALL,MAX_REQUEUES=0", "slurm/train.sbatch", *SIGNAL_RUN, "run.name=budget", **SLOW
    )
    project.wait_for("first checkpoint", lambda: project.checkpoints("budget"), job)
    project.cluster.run("scancel", "--signal=USR1", "--batch", job)
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "3:0", "0"), log
    assert f"not requeueing {job}: 0 requeues already (MAX_REQUEUES=0)" in log


def test_chain_segment_stopped_by_signal_hands_over_to_the_next(project: JobProject) -> None:
    res = project.run(
        "slurm/chain.sh",
        "2",
        "run.name=handover",
        *SIGNAL_RUN[1:],
        "train.epochs=2",
        env=project.env(**SLOW),
    )
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.split()
    project.wait_for("first checkpoint", lambda: project.checkpoints("handover"), first)
    project.cluster.run("scancel", "--signal=USR1", "--batch", first)  # as at a time limit
    infos = [project.finished(j) for j in (first, second)]
    logs = [project.log(f"{project.slug}-{j}") for j in (first, second)]
    assert [(i["JobState"], i["Restarts"]) for i in infos] == [("COMPLETED", "0")] * 2, logs
    assert "AUTO_REQUEUE=0, so the next job of the chain continues" in logs[0]
    assert 0 < resumed_step(logs[1]) < 22
    summary = json.loads((project.path / "runs/handover/summary.json").read_text())
    assert (summary["status"], summary["step"]) == ("finished", 22)


def test_monitor_attaches_to_a_running_job(project: JobProject, tmp_path: Path) -> None:
    # A stand-in nvitop on PATH: the GPU view must pick it and run inside the job's allocation.
    fake = tmp_path / "bin" / "nvitop"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\necho "nvitop on $SLURMD_NODENAME in job $SLURM_JOB_ID"\n')
    fake.chmod(0o755)
    slow = {"PROBE_STEP_DELAY": "0.1"}
    env = project.env(**slow)
    job = project.sbatch("slurm/train.sbatch", "run.name=monitored", "run.figures=false", **slow)
    project.wait_for("running", lambda: project.cluster.state(job) == "RUNNING", job)
    env["PATH"] = f"{fake.parent}:{env['PATH']}"
    res = project.run("slurm/monitor.sh", job, env=env)
    assert res.returncode == 0, res.stderr
    assert f"in job {job}" in res.stdout
    env["PATH"] = env["PATH"].split(":", 1)[1]
    res = project.run("slurm/monitor.sh", job, env=env)
    assert "neither nvitop nor nvidia-smi" in res.stdout
    project.wait_for("a checkpoint", lambda: project.checkpoints("monitored"), job)
    res = project.run("slurm/monitor.sh", "log", job)
    assert res.returncode == 0 and "launch:" in res.stdout
    res = project.run("slurm/monitor.sh", "summary", "monitored")
    assert res.returncode == 0 and "no summary yet" in res.stdout and "samples_per_s" in res.stdout
    # Cancelled (TERM): the trainer checkpoints and reports; the script does not requeue.
    project.cluster.run("scancel", job)
    info = project.finished(job)
    log = project.log(f"{project.slug}-{job}")
    assert info["Restarts"] == "0" and "no requeue" in log, log
    res = project.run("slurm/monitor.sh", "summary", "monitored")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "stopped"
    res = project.run("slurm/monitor.sh", "efficiency", job)
    assert res.returncode == 0, res.stderr
    assert "no accounting records" in res.stdout  # this cluster keeps none
    assert "where the time went:" in res.stdout and f"segment 0 of job {job}" in res.stdout


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_interactive_shell_on_the_interactive_partition(
    cluster: LocalSlurm, template: Path, tmp_path: Path, preset: str
) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"cluster": preset})
    assert baked.ok, baked.stderr
    proj = JobProject(baked.project, cluster)
    shell = tmp_path / "shell"  # stands in for the login shell that srun --pty would start
    shell.write_text(
        "#!/bin/bash\n"
        'echo "partition=$SLURM_JOB_PARTITION name=$SLURM_JOB_NAME gpus=$CUDA_VISIBLE_DEVICES"\n'
    )
    shell.chmod(0o755)
    res = proj.run("slurm/interactive.sh", "--time=00:05:00", env=proj.env(SHELL=str(shell)))
    assert res.returncode == 0, res.stderr
    wanted = PRESETS[preset]["interactive_partition"]
    assert re.search(rf"partition={re.escape(wanted)} name=interactive gpus=\d", res.stdout)


TEST_ONLY_CASES = {
    "default": {},
    "full-node": {"gpus_per_node": "4", "account": "proj01", "mail": "jane@example.org"},
    "conda": {"environment": "conda", "time_limit": "1-00:00:00"},
    "apptainer": {"environment": "apptainer", "time_limit": "45"},
}


@pytest.mark.parametrize("case", sorted(TEST_ONLY_CASES))
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_sbatch_test_only_accepts_every_script(
    cluster: LocalSlurm, template: Path, tmp_path: Path, preset: str, case: str
) -> None:
    answers = {"cluster": preset, **TEST_ONLY_CASES[case]}
    baked = bake("cookiecutter", template, tmp_path, answers)
    assert baked.ok, baked.stderr
    scripts = sorted((baked.project / "slurm").glob("*.sbatch"))
    assert [s.name for s in scripts] == ["pack.sbatch", "sweep.sbatch", "train.sbatch"]
    if answers.get("environment") == "apptainer":  # the image build job (container/)
        scripts.append(baked.project / "container" / "build.sh")
    for script in scripts:
        res = cluster.run("sbatch", "--test-only", str(script), cwd=baked.project, check=False)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"
        assert "to start at" in res.stderr, res.stderr


@pytest.mark.parametrize("partition", sorted(PRESETS["grete"]["partitions"]))
def test_sbatch_test_only_accepts_every_grete_partition(
    cluster: LocalSlurm, template: Path, tmp_path: Path, partition: str
) -> None:
    baked = bake("cookiecutter", template, tmp_path, {"partition": partition})
    assert baked.ok, baked.stderr
    gpu_type = PRESETS["grete"]["partitions"][partition]["gpu_type"]
    header = (baked.project / "slurm/train.sbatch").read_text()
    assert f"#SBATCH --gpus-per-node={gpu_type}:1" in header
    for script in ("slurm/train.sbatch", "slurm/sweep.sbatch", "slurm/pack.sbatch"):
        res = cluster.run("sbatch", "--test-only", script, cwd=baked.project, check=False)
        assert res.returncode == 0 and "to start at" in res.stderr, f"{script}: {res.stderr}"


def test_concurrent_two_rank_array_tasks_on_one_node_do_not_collide(
    cluster: LocalSlurm, template: Path, tmp_path: Path
) -> None:
    # The failing case: task 1 (job id N) and task 0 (id N+1) of one array, two ranks each,
    # running at once on one node. With ports from job id + task id both took the same port.
    baked = bake("cookiecutter", template, tmp_path, {"gpus_per_node": "2"})
    assert baked.ok, baked.stderr
    make_venv(baked.project)
    proj = JobProject(baked.project, cluster)
    proj.cli("prepare")
    params = tmp_path / "two.txt"
    params.write_text("train.lr=0.002\ntrain.lr=0.004\n")
    job = proj.sbatch(
        "--array=0-1",
        "slurm/sweep.sbatch",
        "train.epochs=1",
        "run.figures=false",
        "dist.timeout_minutes=3",
        SWEEP_FILE=str(params),
        PROBE_STEP_DELAY="0.2",
    )
    proj.finished(job)
    infos = [cluster.job(f"{job}_{task}") for task in (0, 1)]
    logs = [proj.log(f"{proj.slug}-sweep-{job}_{task}") for task in (0, 1)]
    assert [i["JobState"] for i in infos] == ["COMPLETED", "COMPLETED"], logs
    ids = [int(i["JobId"]) for i in infos]
    assert sorted(ids) == [int(job), int(job) + 1]  # consecutive
    # The failing case is the one exercised: the old rule (job id + task id) gave both tasks
    # the same port.
    assert ids[0] + 0 == ids[1] + 1
    first, second = sorted(infos, key=lambda i: i["StartTime"])
    assert second["StartTime"] < first["EndTime"], "the tasks did not overlap"
    for log in logs:
        assert "2 process(es) via slurm" in log


def test_array_tasks_that_share_a_run_name_never_share_its_folder(project: JobProject) -> None:
    # Two tasks of one array train into the same run.name at once: the first to lock the run
    # folder trains; the other stops at once with one line naming the holder (its job, PID
    # and host), writes nothing there, and is not requeued (exit 2, a setting to change).
    job = project.sbatch(
        "--array=0-1", "slurm/train.sbatch", "train.epochs=2", "run.figures=false",
        "run.name=shared", PROBE_STEP_DELAY="0.2",
    )  # fmt: skip
    project.finished(job)
    infos = [project.cluster.job(f"{job}_{task}") for task in (0, 1)]
    logs = {i["JobId"]: project.log(f"{project.slug}-{i['JobId']}") for i in infos}
    states = sorted(i["JobState"] for i in infos)
    assert states == ["COMPLETED", "FAILED"], logs
    (winner,) = [i["JobId"] for i in infos if i["JobState"] == "COMPLETED"]
    (loser,) = [i for i in infos if i["JobState"] == "FAILED"]
    refused = [line for line in logs[loser["JobId"]].splitlines() if "is in use by" in line]
    assert len(refused) == 1, logs[loser["JobId"]]
    assert re.search(rf"runs/shared is in use by job {winner}, pid \d+ on \S+;", refused[0])
    assert (loser["ExitCode"], loser["Restarts"]) == ("2:0", "0")
    with (project.path / "runs" / "shared" / "metrics.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row["phase"] == "train"]
    assert steps == sorted(set(steps)), "two writers in one metrics.csv"


def test_make_submit_refuses_a_dirty_tree_unless_told(project: JobProject) -> None:
    args = "ARGS=train.epochs=1 run.name=dirty run.figures=false"
    notes = project.path / "notes.txt"
    notes.write_text("an uncommitted change\n")
    try:
        refused = project.run("make", "submit", args)
        assert refused.returncode != 0
        assert "uncommitted changes" in refused.stderr and "notes.txt" in refused.stderr
        assert "Submitted" not in refused.stdout
        forced = project.run("make", "submit", "ALLOW_DIRTY=1", args)
        assert forced.returncode == 0, forced.stderr
        job = re.search(r"Submitted batch job (\d+)", forced.stdout)[1]
        info = project.finished(job)  # the tree is still dirty when the job starts
    finally:
        notes.unlink()
    assert info["JobState"] == "COMPLETED", project.log(f"{project.slug}-{job}")
    text = (project.path / "runs" / "dirty" / "provenance.jsonl").read_text()
    (origin,) = [json.loads(line) for line in text.splitlines()]
    assert origin["dirty"] is True and len(origin["commit"]) == 40


def test_preempted_job_checkpoints_requeues_and_resumes_identically(
    project: JobProject, reference: dict
) -> None:
    # grete:preemptible on the local cluster: PreemptMode=REQUEUE, GraceTime=30. A job on a
    # higher partition that needs the whole node preempts the training: its ranks get
    # SIGTERM (the batch shell does not), checkpoint and exit with EXIT_REQUEUE; the script
    # requeues, and the next start resumes to the same weights as an undisturbed run.
    job = project.sbatch(
        "--partition=grete:preemptible", "slurm/train.sbatch", *SIGNAL_RUN,
        "run.name=preempted", **SLOW,
    )  # fmt: skip
    name = f"{project.slug}-{job}"
    project.wait_for("first checkpoint", lambda: project.checkpoints("preempted"), job)
    urgent = project.sbatch(
        "--partition=grete:shared", "--exclusive", "--output=/dev/null", "--wrap", "sleep 1"
    )
    project.wait_for("the resume", lambda: resumed_step(project.log(name)) is not None, job)
    info = project.finished(job)
    log = project.log(name)
    assert project.finished(urgent)["JobState"] == "COMPLETED"
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), log
    assert "stop signal (SIGTERM)" in log and f"requeueing {job}" in log
    assert 0 < resumed_step(log) < 220
    assert same_weights(project.final_weights("preempted"), reference)


def test_doctor_lists_the_gpu_types_the_cluster_offers_now(project: JobProject) -> None:
    # MIG slice names change over time: doctor shows what `sinfo` reports today.
    res = project.cli("doctor", "--quick")
    assert "GPU types per partition now (sinfo -o '%P %G')" in res.stdout
    assert re.search(r"grete:interactive .*1g\.20gb", res.stdout), res.stdout


def test_doctor_site_reads_the_real_sinfo_and_scontrol(project: JobProject) -> None:
    # This cluster has every preset partition on one 64-core node with every GPU type: the
    # preset's 128-core grete:shared differs, its MIG slice and partitions do not.
    res = project.cli("doctor", "--site")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "differs: partition grete:shared: 128 cores per node in the preset, nodes have 64" in out
    assert "grete:interactive: GPU type" not in out and "not on this cluster" not in out
    assert re.search(r"site check: \d+ difference\(s\) between the grete preset", out), out
