"""`doctor`: what this process sees of the machine, a quick speed check, and common mistakes."""

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..config import Config
from ..engine.parallel.distributed import resolve_env
from ..engine.parallel.runtime import cpus_available, default_workers
from ..settings import Settings, library_caches
from . import packing
from .plan import read_cluster

SLOW_FS = {"nfs", "nfs4", "cifs", "smb3", "fuse.sshfs"}
GPU_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS")


def _filesystem(path: Path) -> str:
    """File-system type of the mount holding `path` (Linux), or "unknown"."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and target.startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def matmul_tflops(device: torch.device, size: int = 1024, repeats: int = 5) -> float:
    """Dense matmul throughput (fp32, or bf16 on CUDA) in TFLOP/s."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def host_to_device_gbs(device: torch.device, mib: int = 256) -> float:
    """Pinned host-to-GPU copy bandwidth in GB/s."""
    host = torch.empty(mib * 2**20, dtype=torch.uint8).pin_memory()
    host.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(3):
        host.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    return float(3 * host.numel() / (time.perf_counter() - start) / 1e9)


def _software_and_gpus(cuda: bool) -> None:
    print(f"python   {sys.version.split()[0]} ({sys.executable})")
    nccl = torch.cuda.nccl.version() if cuda else "-"  # a tuple in recent releases
    print(
        f"torch    {torch.__version__}, CUDA {torch.version.cuda or '-'}, cuDNN "
        f"{torch.backends.cudnn.version() if cuda else '-'}, NCCL "
        f"{'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}"
    )
    print(f"host     {platform.node()}, {cpus_available()} usable CPUs of {os.cpu_count()}")
    for i in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(i)
        print(
            f"gpu {i}    {props.name}, {props.total_memory / 2**30:.1f} GiB, "
            f"capability {props.major}.{props.minor}"
        )
    if cuda:
        print(f"bf16     {'supported' if torch.cuda.is_bf16_supported() else 'not supported'}")
    else:
        print("gpu      " + ("Apple MPS" if torch.backends.mps.is_available() else "none visible"))


def _gpu_types() -> None:
    """GPU types and MIG slices per partition as the cluster reports them now.

    Slice names such as 1g.20gb change when a site repartitions its GPUs; the job scripts
    take theirs from the answers, so compare here and regenerate (or edit the header).
    """
    if not shutil.which("sinfo"):
        return
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%P %G"],  # noqa: S607 - the site's sinfo from PATH
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return
    if done.returncode == 0 and done.stdout.strip():
        print("gres     GPU types per partition now (sinfo -o '%P %G'):")
        for line in sorted(set(done.stdout.splitlines())):
            print(f"           {line}")


def _slurm(cfg: Config, cuda: bool, warnings: list[str]) -> None:
    _gpu_types()
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if not job:
        print("slurm    not inside a job")
        if shutil.which("sbatch"):
            warnings.append(
                "this looks like a login node (sbatch present, no job): run "
                "training through sbatch/srun, not here"
            )
        return
    gpus = next((env[k] for k in GPU_VARS if env.get(k)), "")
    print(
        f"slurm    job {job}, partition {env.get('SLURM_JOB_PARTITION', '?')}, nodes "
        f"{env.get('SLURM_JOB_NODELIST', '?')}, cpus/task {env.get('SLURM_CPUS_PER_TASK', '-')}, "
        f"gpus {gpus or '-'}, {cfg.data.node_tmp_var}={env.get(cfg.data.node_tmp_var) or '-'}"
    )
    if gpus and not cuda:
        warnings.append(
            "this Slurm job has GPUs but torch sees none: check the CUDA "
            "module/container (--nv) and that torch is a CUDA build"
        )


def _workers_and_storage(cfg: Config, settings: Settings, warnings: list[str]) -> None:
    workers, cpus = cfg.data.num_workers, cpus_available()
    print(f"workers  data.num_workers={workers} (auto would use {default_workers(resolve_env())})")
    if workers > cpus:
        warnings.append(f"data.num_workers={workers} exceeds the {cpus} usable CPUs")
    data_fs = _filesystem(settings.data_dir)
    print(f"data     {settings.data_dir} on {data_fs}")
    home, data = Path.home().resolve(), settings.data_dir.resolve()
    if data_fs in SLOW_FS or data == home or home in data.parents:
        warnings.append(
            f"data dir {settings.data_dir} is on a home or network file system; "
            f"use project/work storage, and data.stage_to_node_tmp inside jobs"
        )


def _caches(warnings: list[str]) -> None:
    """Where the Hugging Face and torch.hub caches are; warn about one in the home directory."""
    home = Path.home().resolve()
    warned: list[Path] = []
    for name, path in library_caches().items():
        print(f"cache    {name}={path}")
        real = path.resolve()
        if home.parent == home or any(real == w or w in real.parents for w in warned):
            continue  # home is "/" (some containers), or inside a cache already named
        if real == home or home in real.parents:
            warned.append(real)
            warnings.append(
                f"{name}={path} is in the home directory (small quota, backed up): set "
                f"{name} in .env to project or scratch storage (see .env.example)"
            )


def _packing(settings: Settings, cuda: bool) -> None:
    """Whether small runs should share a GPU (slurm/pack.sbatch), from the runs' summaries."""
    if cuda:
        gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    else:
        gpu_gb = read_cluster(settings.project_root / "configs" / "cluster.toml").gpu_gb
    lines = packing.advice(packing.trials(settings.runs_dir), gpu_gb)
    for line in lines or ["no run has trained on a GPU yet: a short one tells whether to pack"]:
        print(f"packing  {line}")


def run_doctor(cfg: Config, settings: Settings, quick: bool = False) -> list[str]:
    """Print the report; return the warnings (also printed)."""
    warnings: list[str] = []
    cuda = torch.cuda.is_available()
    _software_and_gpus(cuda)
    _slurm(cfg, cuda, warnings)
    _workers_and_storage(cfg, settings, warnings)
    _caches(warnings)
    _packing(settings, cuda)
    if not quick:
        device = torch.device("cuda" if cuda else "cpu")
        print(f"speed    matmul {matmul_tflops(device):.2f} TFLOP/s on {device}", end="")
        print(f", host->device {host_to_device_gbs(device):.1f} GB/s" if cuda else "")
    for line in warnings:
        print(f"warning: {line}")
    if not warnings:
        print("no problems found")
    return warnings
