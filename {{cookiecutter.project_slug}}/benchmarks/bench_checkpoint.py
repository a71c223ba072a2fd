"""What a checkpoint costs on this machine's device and disk: save, background save, resume.

The test task `toy_tasks.tower` (a residual MLP tower of `--width`, deep enough for `--gib` of
state) is built on the device with AdamW after one step, so the state is what training saves:
weights and both Adam moments. The trainer's checkpoint layer (`checkpoint_io.Checkpointer`)
then, for `dist.strategy` ddp (one file) and fsdp (the sharded format), in `--procs`
processes (gloo on the CPU):

- `save`: a blocking save (best of `--rounds`): the loop waits for all of it;
- `held`: a background save (`run.async_checkpoint`) until training may go on, and `copy`:
  the part of that same save that copied the state off the device (DCP's stager, timed inside
  it), to hold `held` to; `behind`: until it is written (checksums and rename included). The
  second of two: the first also allocates the host buffers the others reuse (`first`);
- `load`: reading the newest checkpoint, verifying it and loading it into the model and
  optimizer, as a resumed run does, from the disk: the checkpoint's pages are dropped from the
  page cache first (`checkpoint.uncache`, posix_fadvise DONTNEED after the save's fsync).

Beside each stands the disk itself, measured the same way in the same folder: `disk` writes
the checkpoint's size of random bytes sequentially in one file and fsyncs it, then reads it
back from the disk (dropped from the cache the same way). The ratios save/disk and load/disk
are the figures to hold at 0.7 or more. `plan`'s estimate stands beside each:
`ops/plan.save_speed` saves and loads samples of up to `--plan-mb` through the same code in
one process, as `<package> plan` does, and the times it predicts for this size are printed
with their ratio to the measured ones.

A profile of one save and one load follows each format: the seconds spent in each part
(serializing, writing, fsync, checksums, reading, copying into the model, the manifest and
rename), summed over this process's threads, each counted once (a part that calls another is
charged only for its own time), beside the wall-clock time.

`save` is the figure behind `STOP_GRACE` (slurm/common.sh): the stop signal must come at least
one blocking save before the time limit, and more where the disk is shared. The last line is

    checkpoint: <procs>x <strategy> <GiB> GiB save/disk=<r> load/disk=<r> held/copy=<r>
    plan/save=<r> plan/load=<r> | ...

Usage: python benchmarks/bench_checkpoint.py [--device auto] [--gib 0.75] [--procs 1]
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # the test tasks (toy_tasks.tower)

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.checkpoint.staging import DefaultStager  # noqa: E402

from under_test import pkg  # noqa: E402  (the package under test, found via pyproject.toml)

checkpoint, checkpoint_io, distributed, shard_files, strategies = (
    pkg("engine.state.checkpoint"),
    pkg("engine.state.checkpoint_io"),
    pkg("engine.parallel.distributed"),
    pkg("engine.state.shard_files"),
    pkg("engine.parallel.strategy"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--gib", type=float, default=0.75, help="state to save (GiB)")
    parser.add_argument("--width", type=int, default=4096, help="tower width")
    parser.add_argument("--procs", type=int, default=1, help="processes (gloo on the CPU)")
    parser.add_argument("--rounds", type=int, default=2, help="blocking saves; the best counts")
    parser.add_argument("--plan-mb", type=int, default=128, help="plan's sample (its --disk-mb)")
    return parser.parse_args()


class Profile:
    """Seconds spent in chosen functions while on, by part, summed over this process's threads.

    Each call is charged only for its own time: a part called inside another (a write inside
    a serialization) is taken off its caller, so the parts add up to the busy time.
    """

    def __init__(self, parts: dict[str, list[tuple[Any, str]]]) -> None:
        """`parts`: a name for each list of (owner, attribute) functions to time."""
        self.parts = parts
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock, self._local = threading.Lock(), threading.local()
        self._saved: list[tuple[Any, str, Any]] = []

    def _timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # the time of the calls inside this one
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = stack.pop()
                if stack:
                    stack[-1] += spent
                with self._lock:
                    self.seconds[part] += spent - inner

        return timed

    def __enter__(self) -> "Profile":
        for part, places in self.parts.items():
            for owner, name in places:
                function = getattr(owner, name)
                self._saved.append((owner, name, function))
                setattr(owner, name, self._timed(part, function))
        return self

    def __exit__(self, *_: object) -> None:
        for owner, name, function in reversed(self._saved):
            setattr(owner, name, function)
        self._saved.clear()


def profile_parts() -> dict[str, list[tuple[Any, str]]]:
    """The parts of a save and a load, each named by what it does."""
    return {
        "copy off the device (staging)": [(DefaultStager, "stage")],
        "serialize (torch.save)": [(torch, "save")],
        "digest and write into the page cache": [(checkpoint.DigestingFile, "write")],
        "checksums (digest)": [(checkpoint, "file_digest"), (shard_files.CheckedFile, "_feed")],
        "fsync (waiting for the disk)": [(os, "fsync")],
        "manifest and rename": [(checkpoint, "write_manifest"), (Path, "replace")],
        "read and unpickle (torch.load)": [(torch, "load")],
        "copy into the model": [(torch.Tensor, "copy_")],
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, work: Callable[[], Any]) -> float:
    """Seconds of `work()` on every process, with the device's queue empty before and after."""
    sync(device)
    distributed.barrier(io=True)
    start = time.perf_counter()
    work()
    sync(device)
    distributed.barrier(io=True)
    return time.perf_counter() - start


def disk_write(folder: Path, size: int) -> float:
    """Seconds of a plain sequential write of `size` bytes into a new file, fsync'd."""
    block = memoryview(os.urandom(64 << 20))  # random: a compressing disk cannot shortcut it
    path = folder / "disk-probe"
    start = time.perf_counter()
    with path.open("wb") as f:
        for offset in range(0, size, len(block)):
            f.write(block[: size - offset])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def disk_read(folder: Path) -> float:
    """Seconds of a plain sequential read of the probe file from the disk; it is removed."""
    path = folder / "disk-probe"
    checkpoint.uncache(path)
    start = time.perf_counter()
    with path.open("rb") as f:
        while f.read(8 << 20):
            pass
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


@contextmanager
def processes(rank: int, procs: int, port: int, device: torch.device) -> Iterator[Any]:
    """This process's DistEnv, in a process group of `procs` (none for one)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    denv = distributed.DistEnv(
        rank=rank, world_size=procs, local_world_size=procs, launcher="torchrun"
    )
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    distributed.init(denv, device, "auto", 30.0)
    try:
        yield denv
    finally:
        distributed.shutdown()


class Saves:
    """One process's model, optimizer and checkpointer, and the steps of the measurements."""

    def __init__(self, args: argparse.Namespace, name: str, denv: Any, out: Path) -> None:
        """The tower of `--gib` on this process's device, one AdamW step taken."""
        self.device = torch.device(f"cuda:{denv.rank}" if args.device == "cuda" else "cpu")
        depth = max(1, round(args.gib * 2**30 / (12 * (args.width**2 + args.width))))
        overrides = [
            "task.name=toy_tasks.tower",
            f"model.hidden={args.width}",
            f"model.depth={depth}",
            f"train.device={self.device.type}",
            f"dist.strategy={name}",
        ]
        cfg = pkg("task").load_config(None, overrides)
        task = pkg("task").load_task(cfg, pkg("settings").get_settings())
        self.strategy = strategies.create(cfg, denv, self.device)
        self.net, model = self.strategy.setup(task)
        optimizer = torch.optim.AdamW(self.net.parameters())
        x = torch.randn(64, 16, device=self.device)
        y = torch.randint(0, 4, (64,), device=self.device)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()  # the Adam moments exist now
        self.stepped = strategies.Optimizers([optimizer])  # saved beside the model
        self.runs, self.main = out / name, denv.is_main
        self.saver = checkpoint_io.Checkpointer(self.runs, self.strategy, denv, keep=1, say=print)
        own = checkpoint.run_id(out) if denv.is_main else ""
        self.saver.run_id = distributed.broadcast_object(own)
        self.step = 0

    def save(self, background: bool = False) -> None:
        self.step += 1
        self.saver.save(self.step, self.net, self.stepped, {"step": self.step}, background)

    def size(self) -> int:
        """Bytes of the checkpoints kept: the newest (keep=1), with its manifest."""
        return sum(f.stat().st_size for f in self.runs.rglob("*") if f.is_file())

    def cold_load(self) -> float:
        """Seconds to load the newest checkpoint from the disk, as a resumed run does."""
        if self.main:
            checkpoint.uncache(checkpoint.list_checkpoints(self.runs)[-1][1])

        def load() -> None:
            state = self.saver.load_latest(self.net, self.stepped)
            self.strategy.load(self.net, self.stepped, state, "bench")

        return timed(self.device, load)

    def background(self) -> tuple[float, float]:
        """(held, behind): seconds until training may go on, and until the save is written."""
        sync(self.device)
        start = time.perf_counter()
        self.save(background=True)
        held = time.perf_counter() - start
        self.saver.wait()
        distributed.barrier(io=True)
        return held, time.perf_counter() - start


def measure(rank: int, args: argparse.Namespace, name: str, port: int, out: Path) -> None:
    """One process of `procs`: every figure of format `name`; rank 0 writes them to `out`."""
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    with processes(rank, args.procs, port, device) as denv:
        run = Saves(args, name, denv, out)
        size, blocking, writes = 0, [], []
        for _ in range(args.rounds):  # the disk alternates with the saves: its mood changes
            blocking.append(timed(device, run.save))
            if run.main:
                size = run.size()
                writes.append(disk_write(out, size))
                (out / "disk-probe").unlink()
        first, _ = run.background()
        with Profile({"copy": [(DefaultStager, "stage")]}) as copying:
            held, behind = run.background()
        loads, reads = [], []
        for _ in range(args.rounds):  # alternating with the disk's own reads, as the saves
            loads.append(run.cold_load())
            if run.main:
                disk_write(out, size)
                reads.append(disk_read(out))
        with Profile(profile_parts()) as saving:
            saved_s = timed(device, run.save)
        with Profile(profile_parts()) as loading:
            loaded_s = run.cold_load()
        run.saver.close()
        if run.main:
            found = {
                "gib": size / 2**30,
                "save": min(blocking),
                "disk_write": size / min(writes),
                "disk_read": size / min(reads),
                "copy": copying.seconds["copy"],
                "first": first,
                "held": held,
                "behind": behind,
                "load": min(loads),
                "profile": [dict(saving.seconds), dict(loading.seconds)],
                "profile_wall": [saved_s, loaded_s],
            }
            (out / f"{name}.json").write_text(json.dumps(found), encoding="utf-8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ratio(found: dict[str, Any], what: str) -> float:
    """The throughput of a save or load as a share of the disk's (write or read)."""
    size = found["gib"] * 2**30
    speed = found["disk_write"] if what == "save" else found["disk_read"]
    return float(size / found[what] / speed)


def report(name: str, args: argparse.Namespace, device: torch.device, f: dict[str, Any]) -> str:
    """The lines of one format: its figures, then its profile."""
    head = (
        f"{args.procs}x {name:4s} on {device.type}: {f['gib']:.2f} GiB; blocking save "
        f"{f['save']:.2f} s ({ratio(f, 'save'):.2f} of the disk's {f['disk_write'] / 1e9:.2f} "
        f"GB/s); resume load {f['load']:.2f} s ({ratio(f, 'load'):.2f} of the disk's "
        f"{f['disk_read'] / 1e9:.2f} GB/s read, both from the disk); background save holds "
        f"training {f['held']:.2f} s against {f['copy']:.2f} s for copying the state "
        f"(the first {f['first']:.2f} s) and is written {f['behind']:.2f} s after it started; "
        f"plan predicted save {f['plan_save']:.2f} s ({f['plan_save'] / f['save']:.2f}x), "
        f"load {f['plan_load']:.2f} s ({f['plan_load'] / f['load']:.2f}x)"
    )
    lines = [head]
    for what, wall, seconds in zip(("save", "load"), f["profile_wall"], f["profile"], strict=True):
        lines.append(f"  profile of one {what} on rank 0 ({wall:.2f} s), seconds over its threads:")
        lines += [
            f"    {part:32s} {spent:6.2f}"
            for part, spent in sorted(seconds.items(), key=lambda kv: -kv[1])
            if spent >= 0.005
        ]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.device = "cuda" if cuda else "cpu"
    device = torch.device(args.device)
    found = {}
    runs = pkg("settings").get_settings().runs_dir  # where checkpoints are written
    runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=runs, prefix=".bench-checkpoint-") as tmp:
        for name in ("ddp", "fsdp"):
            out = Path(tmp) / name
            out.mkdir()
            mp.spawn(measure, args=(args, name, free_port(), out), nprocs=args.procs)
            f = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
            # `plan`'s estimate: a sample saved and loaded the same way, scaled to this size.
            cfg = pkg("task").load_config(None, [f"dist.strategy={name}"])
            speed = pkg("ops.plan").save_speed(cfg, out / "plan", args.plan_mb)
            size = f["gib"] * 2**30
            f["plan_save"], f["plan_load"] = speed.save_s(size), speed.load_s(size)
            found[name] = f
            print(report(name, args, device, f), flush=True)
    print(
        "checkpoint: "
        + " | ".join(
            f"{args.procs}x {name} {f['gib']:.2f} GiB save/disk={ratio(f, 'save'):.2f} "
            f"load/disk={ratio(f, 'load'):.2f} held/copy={f['held'] / f['copy']:.2f} "
            f"plan/save={f['plan_save'] / f['save']:.2f} plan/load={f['plan_load'] / f['load']:.2f}"
            for name, f in found.items()
        )
    )


if __name__ == "__main__":
    main()
