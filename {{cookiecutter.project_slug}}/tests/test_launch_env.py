"""Launch environment: ranks from torchrun or srun, rendezvous from Slurm, CPU budget."""

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from conftest import pkg

distributed = pkg("engine.parallel.distributed")
runtime = pkg("engine.parallel.runtime")
batches = pkg("engine.loop.batches")


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu042", ["gpu042"]),
        ("ggpu[01-03,7]", ["ggpu01", "ggpu02", "ggpu03", "ggpu7"]),
        ("a[1-2],b3,c[09-11]", ["a1", "a2", "b3", "c09", "c10", "c11"]),
        ("n[1-2]-ib[0-1]", ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"]),
        ("node[008-010]", ["node008", "node009", "node010"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert distributed.expand_nodelist(nodelist) == hosts


def test_rendezvous_from_slurm_is_the_same_on_every_rank() -> None:
    env = {"SLURM_JOB_NODELIST": "ggpu[07-08]", "SLURM_JOB_ID": "1234567"}
    assert distributed.rendezvous(env) == ("ggpu07", distributed.rendezvous_port(1234567, 0))
    requeued = distributed.rendezvous({**env, "SLURM_RESTART_COUNT": "1"})
    assert requeued[1] == distributed.rendezvous(env)[1] + 1
    explicit = {**env, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert distributed.rendezvous(explicit) == ("10.0.0.1", 29500)


def test_rendezvous_ports_of_nearby_jobs_and_restarts_never_collide() -> None:
    # Array tasks and jobs submitted together get consecutive ids; task 1 of job 8 (id 8)
    # and task 0 (id 9) once shared a port. Every (id, restart) pair of 1999 consecutive
    # ids and 5 restarts has a port of its own, below the ephemeral range.
    ports = [
        distributed.rendezvous_port(job, restart)
        for job in range(7_654_321, 7_654_321 + 1999)
        for restart in range(5)
    ]
    assert len(set(ports)) == len(ports)
    assert min(ports) > 1024 and max(ports) < 32768


def test_resolve_env_launchers() -> None:
    assert distributed.resolve_env({}).launcher == "single"
    torchrun = distributed.resolve_env(
        {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    )
    assert (torchrun.rank, torchrun.local_rank, torchrun.world_size, torchrun.launcher) == (
        5,
        1,
        8,
        "torchrun",
    )
    srun = distributed.resolve_env(
        {
            "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_NTASKS": "4",
        }
    )
    assert (srun.rank, srun.local_rank, srun.world_size, srun.local_world_size) == (3, 1, 4, 2)
    assert srun.launcher == "slurm"


@pytest.mark.parametrize(
    ("tasks_per_node", "node", "local_world"),
    [("3,2", "0", 3), ("3,2", "1", 2), ("2(x3)", "2", 2), ("4(x2),1", "2", 1), ("1,5", "", 1)],
)
def test_srun_local_world_size_is_this_nodes_task_count(
    tasks_per_node: str, node: str, local_world: int
) -> None:
    env = {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NUM_TASKS": "6",
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_NODEID": node,
    }
    assert distributed.resolve_env(env).local_world_size == local_world


def test_batch_script_without_srun_runs_single_and_says_why() -> None:
    env = {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}
    denv = distributed.resolve_env(env)
    assert denv.launcher == "single"
    assert "srun" in distributed.warn_unlaunched(env, denv)


def test_cpu_budget_follows_the_allocation_not_the_node() -> None:
    single = distributed.DistEnv()
    assert runtime.cpus_available({"SLURM_CPUS_PER_TASK": "1"}) == 1
    assert runtime.default_workers(single, {"SLURM_CPUS_PER_TASK": "1"}) == 0
    torchrun = distributed.DistEnv(local_world_size=2, world_size=2, launcher="torchrun")
    cpus, job = runtime.cpus_available({}), {"SLURM_JOB_ID": "7"}
    assert runtime.cpu_share(torchrun, job) == max(1, cpus // 2)
    assert runtime.cpu_share(single, job) == cpus  # an allocation is the job's own


def test_outside_a_job_half_the_cores_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A laptop or a shared login node runs other work: its threads must not wait for it."""
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    single = distributed.DistEnv()
    assert runtime.cpu_share(single, {}) == 4
    assert runtime.default_workers(single, {}) == 3
    assert runtime.cpu_share(single, {"SLURM_JOB_ID": "7"}) == 8
    for var in ("OMP_NUM_THREADS", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()
    try:
        runtime.limit_threads(single)
        assert torch.get_num_threads() == 4
        note = runtime.threads_note()
        assert note.startswith("4 threads (outside a Slurm job half of the 8 cores")
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice is kept
        torch.set_num_threads(3)
        runtime.limit_threads(single)
        assert (torch.get_num_threads(), runtime.threads_note()) == (
            3,
            "3 threads (OMP_NUM_THREADS)",
        )
    finally:
        torch.set_num_threads(before)


def test_cpu_share_divides_a_shared_mask_among_the_nodes_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    node = {"world_size": 8, "local_world_size": 4}
    srun = distributed.DistEnv(launcher="slurm", **node)
    torchrun = distributed.DistEnv(launcher="torchrun", **node)
    job = {"SLURM_JOB_ID": "7"}
    assert runtime.cpu_share(distributed.DistEnv(), job) == 8
    assert runtime.cpu_share(srun, job) == 2  # four tasks see the same eight cores
    each = {**job, "SLURM_CPUS_PER_TASK": "8"}
    assert runtime.cpu_share(srun, each) == 8  # each task its own
    assert runtime.cpu_share(torchrun, each) == 2  # one task, shared


@pytest.mark.parametrize(("n", "world", "epoch"), [(103, 1, 0), (103, 3, 2), (64, 4, 5)])
def test_in_memory_order_matches_distributed_sampler(n: int, world: int, epoch: int) -> None:
    for rank in range(world):
        sampler = DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=True
        )
        sampler.set_epoch(epoch)
        ours = batches.rank_order(n, seed=7, epoch=epoch, rank=rank, world=world)
        assert ours.tolist() == list(sampler)


def test_both_batch_paths_yield_the_same_batches_and_resume_mid_epoch() -> None:
    x, y = torch.randn(50, 3), torch.arange(50)
    denv = distributed.DistEnv(rank=1, world_size=2, local_world_size=2, launcher="torchrun")
    loading = pkg("engine.loop.loading").Loading(
        batch_size=4,
        denv=denv,
        seed=3,
        device=torch.device("cpu"),
        workers=0,
        prefetch=2,
        collate=None,
    )
    dataset = TensorDataset(x, y)
    fast = batches.make_train_batches(dataset, loading, in_memory=True)
    slow = batches.make_train_batches(dataset, loading, in_memory=False)
    assert len(fast) == len(slow) == 6
    for path in (fast, slow):
        path.set_epoch(4)
    full = [b[1].tolist() for b in fast.iterate()]
    assert full == [b[1].tolist() for b in slow.iterate()]
    assert [b[1].tolist() for b in slow.iterate(start=4)] == full[4:]
    assert [b[1].tolist() for b in fast.iterate(start=4)] == full[4:]
