"""Hardware choices: device, numeric precision, CPU budget, seeds and backend switches."""

import os
import random
from collections.abc import Mapping

import numpy as np
import torch

from ...errors import ConfigError
from .distributed import DistEnv


def pick_device(preference: str, denv: DistEnv) -> torch.device:
    """`auto` takes CUDA (this rank's GPU), then Apple MPS, then the CPU."""
    if preference == "auto":
        if torch.cuda.is_available():
            preference = "cuda"
        elif torch.backends.mps.is_available():
            preference = "mps"
        else:
            preference = "cpu"
    if preference == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("train.device: 'cuda' requested but no CUDA device is visible")
        count = torch.cuda.device_count()
        # One GPU visible per task (Slurm's per-task binding) is fine; several visible GPUs
        # and more local processes than GPUs would put two processes on one GPU.
        if 1 < count < denv.local_world_size:
            raise ConfigError(
                f"{denv.local_world_size} processes on this node but {count} GPUs: start one "
                "task per GPU (--ntasks-per-node = GPUs per node)"
            )
        index = denv.local_rank % count
        torch.cuda.set_device(index)  # before the process group starts, see distributed.init
        return torch.device("cuda", index)
    if preference == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("train.device: 'mps' requested but MPS is not available")
    return torch.device(preference)


def autocast_dtype(precision: str, device: torch.device, strict: bool = True) -> torch.dtype | None:
    """Autocast dtype for `train.precision`, or None for plain fp32.

    `auto` uses bf16 on CUDA GPUs that support it (Ampere and newer): about as accurate as fp32
    for training, much faster on tensor cores, and needs no loss scaling. On CPUs bf16 is
    rarely faster, so `auto` stays in fp32 there. fp16 off CUDA is an error when training
    (`strict`) and plain fp32 when only evaluating a run trained in fp16.
    """
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and native_bf16(device) else None
    if precision == "fp16" and device.type != "cuda":
        if not strict:
            return None
        raise ConfigError("train.precision: fp16 needs a CUDA device (use bf16 or fp32)")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def packed_runs(env: Mapping[str, str] | None = None) -> int:
    """How many runs share this process's GPU and CPUs: PACKED_RUNS (slurm/pack.sbatch), else 1."""
    env = os.environ if env is None else env
    value = env.get("PACKED_RUNS", "") or "1"
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"PACKED_RUNS: must be a whole number >= 1, got {value!r}")
    return int(value)


def billed_gpus(
    device: torch.device, world_size: int, env: Mapping[str, str] | None = None
) -> float:
    """GPUs a run is charged for while it runs: its job's GPUs, a 1/PACKED_RUNS share when packed.

    In a Slurm job the allocation counts (GPUs per node x nodes, as the job's efficiency line
    counts them), whether or not torch uses them; outside one, the GPUs the processes train on.
    """
    env = os.environ if env is None else env
    count = world_size if device.type == "cuda" else 0
    if env.get("SLURM_JOB_ID"):
        per_node = env.get("SLURM_GPUS_ON_NODE", "")
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        nodes = env.get("SLURM_JOB_NUM_NODES", "")
        if per_node.isdigit() or visible:
            on_node = int(per_node) if per_node.isdigit() else len(visible)
            count = on_node * (int(nodes) if nodes.isdigit() else 1)
    return count / packed_runs(env)


def fits_in_memory(nbytes: int, max_gb: float, device: torch.device, share: int = 1) -> bool:
    """`data.in_memory = "auto"`: the train set fits under `max_gb` and half the free GPU memory.

    On a GPU the batches are sliced from a copy of the train set in GPU memory; the other half
    stays for the model and activations. `share` runs packed onto one GPU start at about the
    same time and each sees all of the free memory, so each may take 1/`share` of that half.
    On the CPU the tensors are in memory already.
    """
    if nbytes > max_gb * 1e9:
        return False
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return bool(nbytes <= free / 2 / share)
    return True


def native_bf16(device: torch.device) -> bool:
    """Whether the GPU computes bf16 in hardware (compute capability 8.0, Ampere, or newer).

    `torch.cuda.is_bf16_supported()` also counts emulation (V100, T4), where bf16 is slower
    than fp32.
    """
    return bool(torch.cuda.get_device_capability(device) >= (8, 0))


def configure_backends(deterministic: bool) -> None:
    """TF32 for matmul/cuDNN (about 3x faster than fp32 on A100 at ~1e-3 relative error).

    `deterministic` trades speed for bit-identical reruns on the same hardware.
    """
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = not deterministic
    if deterministic:
        # cuBLAS needs this workspace setting to be deterministic; it must be set before the
        # first cuBLAS call, which is why it is set here and not later.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: a few CUDA kernels have no deterministic version (e.g. the backward of
    # AdaptiveAvgPool2d, which the CNN avoids); PyTorch then warns once instead of stopping.
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators (CPU and all GPUs)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _cpus_per_task(env: Mapping[str, str]) -> int | None:
    """SLURM_CPUS_PER_TASK, set only when the job asked for --cpus-per-task."""
    value = env.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def cpus_available(env: Mapping[str, str] | None = None) -> int:
    """CPU cores this process may use: its affinity mask, capped by SLURM_CPUS_PER_TASK.

    `os.cpu_count()` counts the whole node and would oversubscribe a shared node.
    """
    env = os.environ if env is None else env
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if per_task := _cpus_per_task(env):
        count = min(count or 1, per_task)
    return max(1, count or 1)


def cpu_share(denv: DistEnv, env: Mapping[str, str] | None = None) -> int:
    """CPU cores of this process.

    One rule: the cores this process sees are shared by the processes of its node, so they are
    divided among them, unless srun gave each task cores of its own (SLURM_CPUS_PER_TASK).
    torchrun's processes always share their one task's cores; srun tasks without
    --cpus-per-task all see the node's whole allocation. (Where Slurm binds each such task to
    a single core, the mask is one core and the share stays one.)

    Outside a Slurm job (a laptop, a shared login node) half the cores count: the machine
    runs other work too, and threads that wait for a busy core slow every parallel operation
    many times over (the example's training on two busy cores: 14.8 s with both, 6.4 s with
    one; see docs/performance.md).
    A fixed share, not one from the load: the same machine gives the same numerics.
    """
    env = os.environ if env is None else env
    cpus = cpus_available(env)
    if not env.get("SLURM_JOB_ID"):
        cpus = max(1, cpus // 2)
    if denv.launcher == "slurm" and _cpus_per_task(env):
        return cpus
    # Runs packed onto one task (slurm/pack.sbatch) share its cores as well.
    return max(1, cpus // (denv.local_world_size * packed_runs(env)))


def default_workers(denv: DistEnv, env: Mapping[str, str] | None = None) -> int:
    """DataLoader workers per process: its share of the cores minus one for the process."""
    return cpu_share(denv, env) - 1


def limit_threads(denv: DistEnv) -> None:
    """Use this process's CPU share for intra-op threads unless OMP_NUM_THREADS says otherwise.

    More threads than cores (several processes per node, or a busy shared node) make every
    parallel operation wait for descheduled threads, which can be many times slower.
    """
    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(cpu_share(denv))


def threads_note(env: Mapping[str, str] | None = None) -> str:
    """How many intra-op threads this process uses, and why where it is not obvious."""
    env = os.environ if env is None else env
    count = torch.get_num_threads()
    threads = f"{count} thread" + ("s" if count != 1 else "")
    if env.get("OMP_NUM_THREADS"):
        return f"{threads} (OMP_NUM_THREADS)"
    if env.get("SLURM_JOB_ID"):
        return threads
    return (
        f"{threads} (outside a Slurm job half of the {cpus_available(env)} cores, so the "
        "machine stays responsive; OMP_NUM_THREADS=N to choose)"
    )
