"""`plan`: will the configured model train on the configured GPUs, and what will it cost?

Before a job is submitted: the model's parameters (counted on the meta device, so nothing is
allocated however large it is), the training state each GPU holds under DDP and under FSDP,
the size of a checkpoint, how long one takes to write at the speed measured on the run
directory's disk, and the advice that follows. The arithmetic, for AdamW with fp32 master
weights: 4 bytes of weights per parameter, and per trainable parameter 4 bytes of gradient
and 8 of optimizer moments: 16 B/param for a full fine-tune. DDP keeps all of it on every
GPU (its gradients are views into the all-reduce buckets, not a second copy); FSDP keeps
1/world of it, plus the gathered parameters of the block being computed (bf16 under mixed
precision). Activations come on top; they grow with batch size and sequence length, and only
a short run measures them.

The cluster's facts come from `configs/cluster.toml` (generated from the cluster preset):
GPUs per node, nodes, memory of one GPU and the `$HOME` quota.
"""

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import Config
from ..engine.parallel.distributed import DistEnv
from ..engine.parallel.strategy import Optimizers, create
from ..engine.state import checkpoint
from ..engine.state.checkpoint_io import Checkpointer, slow_save
from ..engine.state.initial_weights import InitialWeights
from ..errors import ConfigError
from ..settings import Settings
from ..task import load_task

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]  # one name for either module

GB = 1e9
# Stop signals come a tenth of the job's limit before it, between 60 and 300 s (common.sh);
# a save should take at most half of the shortest of these.
GRACE_S = 60.0
# The share of a GPU's memory the training state may take and still leave room for
# activations, the CUDA context and the allocator's fragmentation.
STATE_SHARE = 0.6


@dataclass
class Model:
    """What `plan` needs to know of a model: parameter counts and its largest block."""

    params: int
    trainable: int
    buffer_bytes: int
    block_params: int  # the largest entry of an nn.ModuleList (FSDP's unit); all if none
    frozen_bytes: int | None = None  # of the frozen parameters; None: fp32, 4 B each
    saved_frozen_bytes: int = 0  # of frozen parameters checkpoints keep (a teacher, not a base)


@dataclass
class Cluster:
    """The job's shape and the cluster's limits (configs/cluster.toml)."""

    partition: str = "?"
    nodes: int = 1
    gpus_per_node: int = 1
    gpu_gb: float = 0.0  # memory of one GPU; 0: unknown
    gpu_memory: str = "unknown"  # as the preset says it
    home_quota_gb: float = 0.0  # 0: unknown

    @property
    def world(self) -> int:
        """GPUs of the job (processes)."""
        return self.nodes * self.gpus_per_node


def gpu_gb(text: str) -> float:
    """The smallest size in a preset's GPU memory text ("40G or 80G" -> 40); 0 if none."""
    sizes = [float(n) for n in re.findall(r"(\d+(?:\.\d+)?)\s*G", text)]
    return min(sizes, default=0.0)


def read_cluster(path: Path) -> Cluster:
    """The `[cluster]` table of `path`; the defaults (one GPU, sizes unknown) without it."""
    if not path.is_file():
        return Cluster()
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("cluster", {})
        memory = str(table.get("gpu_memory", "unknown"))
        return Cluster(
            partition=str(table.get("partition", "?")),
            nodes=int(table.get("nodes", 1)),
            gpus_per_node=int(table.get("gpus_per_node", 1)),
            gpu_gb=gpu_gb(memory),
            gpu_memory=memory,
            home_quota_gb=float(table.get("home_quota_gb", 0)),
        )
    except (tomllib.TOMLDecodeError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: {err}") from None


def count(model: nn.Module, base: nn.Module | None = None) -> Model:
    """Parameter counts of `model` (which may live on the meta device).

    `base`: the part `model.init_from` fills, whose frozen parameters checkpoints leave out.
    """
    params = sum(p.numel() for p in model.parameters())
    left_out = {id(p) for p in base.parameters()} if base is not None else set()
    blocks = [
        sum(p.numel() for p in block.parameters())
        for module in model.modules()
        if isinstance(module, nn.ModuleList)
        for block in module
    ]
    return Model(
        params=params,
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        block_params=max(blocks, default=params),
        frozen_bytes=sum(
            p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad
        ),
        saved_frozen_bytes=sum(
            p.numel() * p.element_size()
            for p in model.parameters()
            if not p.requires_grad and id(p) not in left_out
        ),
    )


def state_bytes(model: Model, strategy: str, world: int, compute_bytes: int) -> float:
    """Training state on one GPU: fp32 weights, and gradients and AdamW moments of trainables.

    `compute_bytes`: bytes per parameter of the gathered block under FSDP (2 for bf16).
    Twice the largest block: FSDP gathers the next block while computing this one.
    """
    frozen = model.params - model.trainable
    frozen_bytes = 4 * frozen if model.frozen_bytes is None else model.frozen_bytes
    full = frozen_bytes + 16 * model.trainable + model.buffer_bytes
    if strategy == "ddp":
        return float(full)
    return full / world + 2 * compute_bytes * model.block_params


def checkpoint_bytes(model: Model) -> float:
    """One checkpoint: fp32 weights and AdamW's two moments of each trainable, and buffers.

    A frozen base from `model.init_from` (under LoRA) is left out of checkpoints (those files
    hold it; `frozen_keys` in engine/parallel/strategy.py); other frozen parameters (a
    teacher) are kept.
    """
    return float(12 * model.trainable + model.buffer_bytes + model.saved_frozen_bytes)


@dataclass(frozen=True)
class SaveSpeed:
    """Seconds to save and to load a checkpoint: a fixed part plus its bytes over a speed.

    The fixed part (opening files, the metadata, fsyncs, the processes agreeing) is what makes
    a small sample slow per byte; fitted on two samples, it keeps the estimate for a large
    checkpoint from being too long.
    """

    save_fixed: float
    save_rate: float  # bytes per second
    load_fixed: float
    load_rate: float

    def save_s(self, size: float) -> float:
        """Seconds to write a checkpoint of `size` bytes."""
        return self.save_fixed + size / self.save_rate

    def load_s(self, size: float) -> float:
        """Seconds to verify and load a checkpoint of `size` bytes, as a resume does."""
        return self.load_fixed + size / self.load_rate


def _fit(small: tuple[float, float], large: tuple[float, float]) -> tuple[float, float]:
    """(fixed seconds, bytes per second) through two (bytes, seconds) samples.

    Where the two are too close to tell (a noisy disk, or one size: `--disk-mb 1` makes both
    samples 1 MB), all of the time counts as bytes.
    """
    (bytes_a, seconds_a), (bytes_b, seconds_b) = small, large
    if bytes_b <= bytes_a or seconds_b - seconds_a < 0.1 * seconds_b:
        return 0.0, bytes_b / seconds_b
    rate = (bytes_b - bytes_a) / (seconds_b - seconds_a)
    return max(0.0, seconds_b - bytes_b / rate), rate


def _time_sample(cfg: Config, folder: Path, megabytes: int) -> tuple[float, float, float]:
    """(bytes, save seconds, load seconds) of a sample checkpoint of `megabytes`."""
    # Half of it weights, half optimizer state (SGD's momentum), as a trained model has both:
    # fp32 in tensors of up to 16 MiB, like a large model's matrices: the sample of 128 MB
    # fills each of DCP's four writer files as a checkpoint does (in 64 MiB tensors, two).
    floats = megabytes * 125_000
    chunks = [min(4 << 20, floats - i) for i in range(0, floats, 4 << 20)]
    net = nn.ParameterList(nn.Parameter(torch.rand(n)) for n in chunks)
    sgd = torch.optim.SGD(net.parameters(), lr=0.0, momentum=0.9)
    for weight in net.parameters():
        weight.grad = torch.rand_like(weight)  # the momentum: random too
    sgd.step()  # the momentum exists now (lr 0: the weights stay)
    optimizer = Optimizers([sgd])
    denv = DistEnv()
    strategy = create(cfg, denv, torch.device("cpu"))
    with tempfile.TemporaryDirectory(dir=folder, prefix=".plan-") as tmp:
        writer = Checkpointer(Path(tmp), strategy, denv, keep=1, say=lambda _: None)
        start = time.perf_counter()
        writer.save(1, net, optimizer, {"config": {}}, background=False)
        saved = time.perf_counter()
        checkpoint.uncache(checkpoint.list_checkpoints(Path(tmp))[-1][1])  # read from the disk
        uncached = time.perf_counter()
        state = writer.load_latest(net, optimizer)
        assert state is not None  # just written
        strategy.load(net, optimizer, state, "plan")
        loaded = time.perf_counter()
        writer.close()
    return 8.0 * sum(chunks), saved - start, loaded - uncached


def save_speed(cfg: Config, folder: Path, megabytes: int) -> SaveSpeed:
    """How fast checkpoints are saved and loaded in `folder`, timed through the code itself.

    Samples of `megabytes` and a quarter of it, random fp32 tensors (random: a compressing
    file system cannot shortcut it), are saved as `dist.strategy` saves a checkpoint
    (`checkpoint_io.Checkpointer`: one file, or DCP shards from parallel writer threads;
    checksums, fsync, rename) and loaded into the sample as a resume does (checksums
    verified), from the disk (its pages dropped from the cache first), in a temporary folder
    in `folder` that is removed after. So the figure holds the digest and the format, not
    only the disk. Each sample is timed twice and the faster counts: a shared disk's moments
    of contention would otherwise decide the estimate.
    """
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if megabytes * 1e6 > free / 2:
        raise ConfigError(
            f"--disk-mb: {megabytes} MB is more than half of the {free / 1e6:.0f} MB free in "
            f"{folder}; measure with less"
        )

    def best(mb: int) -> tuple[float, float, float]:
        """The sample of `mb` timed twice: its bytes, the faster save and the faster load."""
        first, second = _time_sample(cfg, folder, mb), _time_sample(cfg, folder, mb)
        return first[0], min(first[1], second[1]), min(first[2], second[2])

    small, large = best(max(1, megabytes // 4)), best(megabytes)
    save = _fit((small[0], small[1]), (large[0], large[1]))
    load = _fit((small[0], small[2]), (large[0], large[2]))
    return SaveSpeed(*save, *load)


def advice(
    model: Model,
    cluster: Cluster,
    *,
    ddp: float,
    fsdp: float,
    footprint: float,
    save_s: float | None,
    runs_in_home: bool,
    every_minutes: float = 0.0,
) -> list[str]:
    """What to do, given the arithmetic: strategy, checkpointing, LoRA, where runs live."""
    tips = []
    budget = STATE_SHARE * cluster.gpu_gb * GB
    if not budget:
        tips.append(
            "GPU memory unknown: set gpu_memory in configs/cluster.toml (or --gpu-memory) "
            "to judge the strategy"
        )
    elif ddp <= budget:
        tips.append(
            f"strategy: ddp (the default) fits: {ddp / GB:.1f} GB of state per GPU, "
            f"{ddp / (cluster.gpu_gb * GB):.0%} of {cluster.gpu_gb:g} GB"
        )
    elif fsdp <= budget:
        tips.append(
            f"strategy: dist.strategy=fsdp: {fsdp / GB:.1f} GB per GPU sharded over "
            f"{cluster.world} GPU(s), where ddp needs {ddp / GB:.1f} GB on each"
        )
        if fsdp > budget / 2:
            tips.append(
                "activations: little room is left; train.activation_checkpointing=blocks "
                "recomputes each block's activations in the backward pass instead of storing them"
            )
    else:
        tips.append(
            f"does not fit: {fsdp / GB:.1f} GB per GPU even sharded over {cluster.world} "
            f"GPU(s) ({budget / GB:.0f} GB usable): more GPUs (nodes), or train fewer parameters"
        )
    if model.trainable == model.params and budget and ddp > budget:
        frozen = Model(model.params, 0, model.buffer_bytes, model.block_params)
        lora = state_bytes(frozen, "ddp", cluster.world, 4)
        tips.append(
            f"LoRA: with the base frozen the state is about {lora / GB:.1f} GB per GPU under ddp "
            f"(4 B/param), {lora / cluster.world / GB:.1f} GB under fsdp, plus the adapters; "
            "the lm example's task.lora_rank shows how"
        )
    slow = slow_save(save_s, 60 * every_minutes, GRACE_S) if save_s is not None else {}
    if interval := slow.get("interval"):
        tips.append(f"checkpoints: {interval}")
    if grace := slow.get("grace"):
        tips.append(
            f"checkpoints: {grace} at the shortest: ask for --time of 10 h or more (a 300 s "
            "grace), or write runs to a faster file system"
        )
    quota = cluster.home_quota_gb * GB
    if runs_in_home and (footprint > quota / 4 if quota else footprint > 5 * GB):
        limit = f"the {cluster.home_quota_gb:g} GB $HOME quota" if quota else "$HOME"
        tips.append(
            f"storage: the run's checkpoints take {footprint / GB:.1f} GB, too much for {limit}: "
            "set RUNS_DIR in .env to project storage or a workspace"
        )
    return tips


def run_plan(cfg: Config, settings: Settings, cluster: Cluster, disk_mb: int) -> list[str]:
    """Print the plan for `cfg` on `cluster`; return the advice."""
    task = load_task(cfg, settings)
    task.datasets(task.processed_dir)  # tasks may learn their shapes from the data
    # The compute dtype on the GPUs planned for (`auto` is bf16 on Grete's).
    dtype = {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16}
    compute_dtype = dtype.get(cfg.train.precision)
    if cfg.model.init_from:  # built as the run builds it: a frozen base may stay in 16 bits
        init = Path(cfg.model.init_from)
        net = InitialWeights(task, init, cfg.run.seed, compute_dtype).build()
        model = count(net, base=task.pretrained_target(net))
    else:
        with torch.device("meta"):
            model = count(task.build_model())
    world = cluster.world
    compute = 2 if compute_dtype else 4
    ddp, fsdp = (state_bytes(model, s, world, compute) for s in ("ddp", "fsdp"))
    ckpt = checkpoint_bytes(model)
    files = cfg.run.keep_checkpoints + (1 if cfg.run.best_metric else 0)
    footprint = ckpt * files
    runs = settings.runs_dir

    print(
        f"model    task {task.name}: {model.params:,} parameters, {model.trainable:,} trainable, "
        f"largest block {model.block_params:,}"
    )
    memory = f"{cluster.gpu_gb:g} GB" if cluster.gpu_gb else "memory unknown"
    print(
        f"cluster  partition {cluster.partition}: {cluster.nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU(s), {memory} each ({cluster.gpu_memory})"
    )
    print("state    per GPU: fp32 weights 4 B/param + gradients 4 + AdamW 8 per trainable")
    print(f"  ddp    {ddp / GB:10.3f} GB  (every GPU holds everything)")
    print(
        f"  fsdp   {fsdp / GB:10.3f} GB  (1/{world} of it, plus the gathered block in "
        f"{'bf16' if compute == 2 else 'fp32'})"
    )
    print("         activations come on top: measure them with a short run")
    print(
        f"ckpt     {ckpt / GB:.3f} GB per checkpoint; {files} kept: {footprint / GB:.3f} GB "
        f"in {runs}"
    )
    save_s = None
    if disk_mb > 0:
        speed = save_speed(cfg, runs, disk_mb)
        save_s = speed.save_s(ckpt)
        print(
            f"disk     {speed.save_rate / 1e6:.0f} MB/s saving, {speed.load_rate / 1e6:.0f} MB/s "
            f"loading samples of up to {disk_mb} MB as {cfg.dist.strategy} checkpoints are "
            f"(checksums, fsync) in {runs}, plus {speed.save_fixed:.2f} s and "
            f"{speed.load_fixed:.2f} s each: a checkpoint takes about {save_s:.3g} s, a resume "
            f"reads it in {speed.load_s(ckpt):.3g} s"
        )
    home = Path.home().resolve()
    in_home = runs.resolve().is_relative_to(home)
    tips = advice(
        model,
        cluster,
        ddp=ddp,
        fsdp=fsdp,
        footprint=footprint,
        save_s=save_s,
        runs_in_home=in_home,
        every_minutes=cfg.run.checkpoint_every_minutes,
    )
    print("advice")
    for tip in tips:
        print(f"  - {tip}")
    return tips
