"""What a checkpoint costs on this machine's device and disk: save, background save, resume.

The test task `toy_tasks.tower` (a residual MLP tower, `--width` x `--depth`) is built on the
device with AdamW after one step, so the state is what training saves: weights and both Adam
moments. The trainer's checkpoint layer (`checkpoint_io.Checkpointer`) then, for
`dist.strategy` ddp (one file) and fsdp (the sharded format; one shard in one process):

- `save`: a blocking save (best of `--rounds`): the loop waits for all of it;
- `held`: a background save (`run.async_checkpoint`) until training may go on (the copy of the
  state off the device), and `behind`: until it is written (checksums and rename included);
  the second of two, since the first also allocates the host buffers the others reuse
  (`first`);
- `load`: reading the newest checkpoint and loading it into the model and optimizer, as a
  resumed run does.

Beside each save and load stands the disk itself, measured the same way in the same folder:
`disk` writes the checkpoint's size of random bytes sequentially in one file and fsyncs it,
then reads it back; the ratios save/disk and load/disk are the figures to hold at 0.7 or
more. A digest line times the checksums on one core (SHA-256, CRC-32, xxh3-128: the one
checkpoints use) against the disk's write speed. `plan`'s estimate stands beside each:
`ops/plan.save_speed` saves and loads samples of up to `--plan-mb` through the same code, and
the save and load times it predicts for this size are printed with their ratio to the
measured ones.

Then the fsdp format's blocking save with one writer thread per process against
`checkpoint_io.WRITE_THREADS`, interleaved round by round (the best of `--rounds` each).

`save` is the figure behind `STOP_GRACE` (slurm/common.sh): the stop signal must come at least
one blocking save before the time limit, and more where the disk is shared. With background
saves, checkpoints further apart than `behind` hold training only for `held`. The last line is

    checkpoint: <strategy> <GiB> GiB save=<s> s (<GB/s> GB/s) save/disk=<r> held=<s> s
    load=<s> s load/disk=<r> plan/save=<r> plan/load=<r> | ...

Usage: python benchmarks/bench_checkpoint.py [--device auto] [--width 4096] [--depth 4]
"""

import argparse
import hashlib
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # the test tasks (toy_tasks.tower)

import torch  # noqa: E402
import xxhash  # noqa: E402

from under_test import pkg  # noqa: E402  (the package under test, found via pyproject.toml)

checkpoint, checkpoint_io, distributed = (
    pkg("engine.checkpoint"),
    pkg("engine.checkpoint_io"),
    pkg("engine.distributed"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--width", type=int, default=4096, help="tower width")
    parser.add_argument("--depth", type=int, default=4, help="tower blocks")
    parser.add_argument("--rounds", type=int, default=2, help="blocking saves; the best counts")
    parser.add_argument("--plan-mb", type=int, default=128, help="plan's sample (its --disk-mb)")
    return parser.parse_args()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, work: Callable[[], None]) -> float:
    """Seconds of `work()`, with the device's queue empty before and after."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


def drop_caches() -> bool:
    """Empty the page cache, so that reads come from the disk (needs root); whether it could."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def disk_write(folder: Path, size: int) -> float:
    """Seconds of a plain sequential write of `size` bytes into a new file, fsync'd."""
    block = os.urandom(64 << 20)  # random: a compressing file system cannot shortcut it
    path = folder / "disk-probe"
    start = time.perf_counter()
    with path.open("wb") as f:
        for offset in range(0, size, len(block)):
            f.write(block[: size - offset])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def disk_read(folder: Path) -> float:
    """Seconds of a plain sequential read of the probe file, which is then removed."""
    path = folder / "disk-probe"
    start = time.perf_counter()
    with path.open("rb") as f:
        while f.read(8 << 20):
            pass
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def digest_speeds() -> dict[str, float]:
    """Bytes per second of each checksum on one core, over 256 MiB in memory."""
    data = os.urandom(256 << 20)
    hashes = {
        "sha256": lambda: hashlib.sha256(data).digest(),
        "crc32": lambda: zlib.crc32(data),
        "xxh3_128": lambda: xxhash.xxh3_128(data).digest(),
    }
    cpu = torch.device("cpu")
    return {name: len(data) / min(timed(cpu, f) for _ in range(3)) for name, f in hashes.items()}


def measure(args: argparse.Namespace, name: str, device: torch.device, runs: Path) -> dict:
    overrides = [
        "task.name=toy_tasks.tower",
        f"model.hidden={args.width}",
        f"model.depth={args.depth}",
        f"train.device={device.type}",
        f"dist.strategy={name}",
    ]
    cfg = pkg("task").load_config(None, overrides)
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    denv = distributed.DistEnv()
    strategy = pkg("engine.strategy").create(cfg, denv, device)
    net, model = strategy.setup(task)
    optimizer = torch.optim.AdamW(net.parameters())
    x = torch.randn(64, 16, device=device)
    y = torch.randint(0, 4, (64,), device=device)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()  # the Adam moments exist now
    stepped = pkg("engine.strategy").Optimizers([optimizer])  # saved beside the model
    saver = checkpoint_io.Checkpointer(runs / name, strategy, denv, keep=1, say=print)
    saver.run_id = checkpoint.run_id(runs)
    step = 0

    def save(background: bool) -> None:
        nonlocal step
        step += 1
        saver.save(step, net, stepped, {"step": step}, background)

    size = 0
    blocking, plain = [], []
    for _ in range(args.rounds):  # the disk alternates with the saves: its mood changes
        blocking.append(timed(device, lambda: save(False)))
        size = sum(f.stat().st_size for f in (runs / name).rglob("*") if f.is_file())
        plain.append(disk_write(runs, size))
        (runs / "disk-probe").unlink()
    held, behind = [], []
    for _ in range(2):
        sync(device)
        start = time.perf_counter()
        save(True)
        held.append(time.perf_counter() - start)
        saver.wait()
        behind.append(time.perf_counter() - start)

    def load() -> None:
        state = saver.load_latest(net, stepped)
        strategy.load(net, stepped, state, "bench")

    cold = drop_caches()
    loaded = timed(device, load)
    saver.close()
    disk_write(runs, size)
    drop_caches()
    read_s = disk_read(runs)
    # `plan`'s estimate: a sample saved and loaded the same way, scaled to this size.
    speed = pkg("ops.plan").save_speed(cfg, runs / f"plan-{name}", args.plan_mb)
    return {
        "plan_save": speed.save_s(size),
        "plan_load": speed.load_s(size),
        "gib": size / 2**30,
        "save": min(blocking),
        "gbs": size / 1e9 / min(blocking),
        "disk_write": size / min(plain),
        "disk_read": size / read_s,
        "cold": cold,
        "first": held[0],
        "held": held[1],
        "behind": behind[1],
        "load": loaded,
    }


WARM = "from the page cache: run as root to empty it first"


def ratio(found: dict, what: str) -> str:
    """The throughput of a save or load as a share of the disk's (write or read)."""
    size = found["gib"] * 2**30
    speed = found["disk_write"] if what == "save" else found["disk_read"]
    return f"{size / found[what] / speed:.2f}"


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("ddp", "fsdp"):
            found[name] = f = measure(args, name, device, Path(tmp))
            print(
                f"{name:5s} on {device.type}: checkpoint {f['gib']:.2f} GiB; blocking save "
                f"{f['save']:.2f} s ({f['gbs']:.2f} GB/s, {ratio(f, 'save')} of the disk's "
                f"{f['disk_write'] / 1e9:.2f} GB/s); background save holds training "
                f"{f['held']:.2f} s (the first {f['first']:.2f} s) and is written "
                f"{f['behind']:.2f} s after it started; resume load {f['load']:.2f} s "
                f"({ratio(f, 'load')} of the disk's {f['disk_read'] / 1e9:.2f} GB/s read, "
                f"{'from the disk' if f['cold'] else WARM}); plan "
                f"predicted save {f['plan_save']:.2f} s ({f['plan_save'] / f['save']:.2f}x), "
                f"load {f['plan_load']:.2f} s ({f['plan_load'] / f['load']:.2f}x)",
                flush=True,
            )
        threads = {count: [] for count in (1, checkpoint_io.WRITE_THREADS)}
        default = checkpoint_io.WRITE_THREADS
        for index in range(args.rounds):
            for count, saves in threads.items():
                checkpoint_io.WRITE_THREADS = count  # read by each save's writer
                folder = Path(tmp) / f"threads-{count}-{index}"
                folder.mkdir()
                saves.append(measure(args, "fsdp", device, folder)["save"])
        checkpoint_io.WRITE_THREADS = default
        one, many = min(threads[1]), min(threads[default])
        print(
            f"fsdp save: {default} writer threads {many:.2f} s, 1 thread {one:.2f} s: "
            f"{one / many:.2f}x"
        )
    speeds = digest_speeds()
    write = max(f["disk_write"] for f in found.values())
    print(
        "digest on one core: "
        + ", ".join(f"{name} {rate / 1e9:.2f} GB/s" for name, rate in speeds.items())
        + f"; the disk writes {write / 1e9:.2f} GB/s: checkpoints use {checkpoint.DIGEST} "
        f"({speeds[checkpoint.DIGEST] / write:.1f}x the disk)"
    )
    print(
        "checkpoint: "
        + " | ".join(
            f"{name} {f['gib']:.2f} GiB save={f['save']:.2f} s ({f['gbs']:.2f} GB/s) "
            f"save/disk={ratio(f, 'save')} held={f['held']:.2f} s load={f['load']:.2f} s "
            f"load/disk={ratio(f, 'load')} "
            f"plan/save={f['plan_save'] / f['save']:.2f} plan/load={f['plan_load'] / f['load']:.2f}"
            for name, f in found.items()
        )
    )


if __name__ == "__main__":
    main()
