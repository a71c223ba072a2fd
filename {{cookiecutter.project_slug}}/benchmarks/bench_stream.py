"""Streams: tar shards against raw bytes, the stream loader against a plain DataLoader, resume.

Three figures, each side by side in one run (alternating order, best of `--rounds`):

1. `tar/raw`: the `stream` example's way of reading, WebDataset-style tar shards through
   `TarShards` (the standard library's tarfile), each sample decoded into a tensor, fed by the
   project's stream loader, against a plain DataLoader whose workers read the same files'
   bytes whole and cut them into as many pieces as there are samples, with no parsing and no
   decoding. Same disk, same workers, same batch size.
2. `loader/plain`: the project's stream loader (`engine.loop.stream_batches.StreamBatches`, which
   seeds each batch and tags it with its worker's position) against a plain DataLoader over
   the same `IterableDataset`.
3. `resume/epoch`: a stream with no state of its own, stopped after `--consumed` samples: the
   start-up of the resumed pass (every worker pulls and throws away what it had used) as a
   ratio to one epoch of the same stream.

`--before DIR` (the package folder of an earlier checkout, e.g. `src/<package>` of a `git
worktree` at the last release) times that copy's `tar` and `loader` sides too, in the same
rounds, alternated with today's: the last line gives `tar now/before` and `loader
now/before`, the cost (below 1) or the gain of what changed since, such as the readers'
checks of damaged data. Both copies' modules are loaded into one fork server first, so
neither side's workers import more than the other's.

Runs with the package and its runtime dependencies alone (no test tools). The last lines:

    tar/raw: <ratio>  loader/plain: <ratio>  resume/epoch: <ratio> (<consumed> samples)
    tar now/before: <ratio>  loader now/before: <ratio>      (with --before)

Usage: python benchmarks/bench_stream.py [--workers 2] [--rounds 3] [--dir /path]
       [--before DIR]
"""

import argparse
import importlib.util
import multiprocessing
import multiprocessing.forkserver
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
PACKAGE = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]


# The wing of each engine module used here; a copy from before the wings has it in `engine`.
WING = {
    "stream_batches": "loop",
    "loading": "loop",
    "fork_server_start": "loop",
    "distributed": "parallel",
}


def engine_module(name: str, module: str) -> str:
    """The dotted path of an engine module of package `name`, in either layout."""
    wing = WING[module]
    winged = importlib.util.find_spec(f"{name}.engine.{wing}") is not None
    return f"{name}.engine.{wing}.{module}" if winged else f"{name}.engine.{module}"


def loading_settings(name: str) -> type | None:
    """The loader settings class of package `name`; None in a copy from before it existed."""
    path = engine_module(name, "loading")
    return None if importlib.util.find_spec(path) is None else importlib.import_module(path).Loading


def side(name: str) -> SimpleNamespace:
    """What the benchmark uses of package `name` (today's, or an earlier copy's)."""
    load = importlib.import_module
    return SimpleNamespace(
        name=name,
        tars=load(f"{name}.data.tars"),
        feeding=load(engine_module(name, "stream_batches")),
        DistEnv=load(engine_module(name, "distributed")).DistEnv,
        Loading=loading_settings(name),
    )


NOW = side(PACKAGE)
tars = NOW.tars


def before(folder: Path, tmp: Path) -> SimpleNamespace:
    """The package copy in `folder`, imported under another name (its imports are relative)."""
    name = f"before_{PACKAGE}"
    shutil.copytree(folder, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(tmp))
    return side(name)


def start_fork_server(packages: list[SimpleNamespace]) -> None:
    """One fork server with every package's modules, before either's first pass (the modules
    the stream loader's own server preloads: `fork_server` in engine/loop/stream_batches.py)."""
    modules = [
        module
        for p in packages
        for module in (engine_module(p.name, "fork_server_start"), f"{p.name}.data.streams")
    ]
    modules += [f"{p.name}.data.tars" for p in packages]
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", *modules])
    multiprocessing.forkserver.ensure_running()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    # 3 KB: a 32 x 32 colour image; 48 KB: 128 x 128. Per-sample work in Python weighs on the
    # small ones, the bytes on the large ones.
    parser.add_argument("--sample-kb", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--consumed", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="disk to test (default: /tmp)")
    parser.add_argument(
        "--before", type=Path, default=None, help="an earlier copy of the package, to compare"
    )
    return parser.parse_args()


def decode(sample: dict[str, bytes]) -> tuple[torch.Tensor, int]:
    pixels = torch.frombuffer(bytearray(sample["pixels"]), dtype=torch.uint8)
    return pixels.reshape(3, -1), int(sample["cls"])


def write(folder: Path, shards: int, per_shard: int, sample_bytes: int) -> list[Path]:
    g = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (per_shard, sample_bytes), dtype=torch.uint8, generator=g)
    samples = (
        {
            "__key__": f"{i:08d}",
            "pixels": i.to_bytes(4, "little") + noise[i % per_shard, 4:].numpy().tobytes(),
            "cls": b"%d" % (i % 10),
        }
        for i in range(shards * per_shard)
    )
    return tars.write_tar_shards(samples, folder, "train", per_shard)


class RawShards(IterableDataset):
    """Each worker's files read whole, cut into one piece per sample: bytes only."""

    def __init__(self, files: list[Path], per_shard: int) -> None:
        self.files, self.per_shard = files, per_shard

    def __iter__(self) -> Iterator[bytes]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for path in self.files[worker::workers]:
            data = path.read_bytes()
            step = len(data) // self.per_shard
            for i in range(self.per_shard):
                yield data[i * step : (i + 1) * step]


class Readings(IterableDataset):
    """`n` small samples made in memory (a simulation's output), split across workers."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.table = torch.randn(4096, 32, generator=torch.Generator().manual_seed(1))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(worker, self.n, workers):
            yield self.table[i % 4096], i % 10


def plain(dataset: IterableDataset, args: argparse.Namespace, collate: Any = None) -> float:
    """Samples per second of a plain DataLoader over `dataset`."""
    loader = DataLoader(
        dataset, batch_size=args.batch, num_workers=args.workers, collate_fn=collate
    )
    start, seen = time.perf_counter(), 0
    for batch in loader:
        seen += len(batch) if isinstance(batch, list) and collate else len(batch[0])
    return seen / (time.perf_counter() - start)


def project(dataset: IterableDataset, args: argparse.Namespace, package: Any = NOW) -> float:
    """Samples per second of the project's stream loader (of `package`) over `dataset`."""
    batches = make(dataset, args, package)
    start, seen = time.perf_counter(), 0
    try:
        for batch in batches.iterate():
            seen += len(batch[0])
    finally:  # its workers ignore SIGTERM: end them on every way out
        batches.close()
    return seen / (time.perf_counter() - start)


def make(dataset: IterableDataset, args: argparse.Namespace, package: Any = NOW) -> Any:
    shared = {"batch_size": args.batch, "denv": package.DistEnv(), "seed": 0, "collate": None}
    shared["device"] = torch.device("cpu")
    if package.Loading is None:  # an earlier copy (--before): its settings one by one
        return package.feeding.StreamBatches(
            dataset, num_workers=args.workers, prefetch_factor=2, where="bench", **shared
        )
    loading = package.Loading(workers=args.workers, prefetch=2, **shared)
    return package.feeding.StreamBatches(dataset, loading, where="bench")


def resume_startup(args: argparse.Namespace) -> tuple[float, float]:
    """Seconds to the first batch of a pass resumed after `consumed` samples, and of an epoch."""
    epoch = args.consumed * 2  # the stop came halfway through
    batches = make(Readings(epoch), args)
    start = time.perf_counter()
    try:
        for _ in batches.iterate():
            pass
    finally:
        batches.close()
    epoch_s = time.perf_counter() - start
    workers = max(1, args.workers)
    per_worker = args.consumed // workers // args.batch * args.batch
    tags = {
        w: {"pulled": per_worker, "batches": per_worker // args.batch, "state": None}
        for w in range(workers)
    }
    saved = {
        "epoch": 0,
        "workers": workers,
        "world": 1,
        "batch_size": args.batch,
        "next": 0,
        "tags": tags,
    }
    resumed = make(Readings(epoch), args)
    resumed.restore([saved], "bench")
    start = time.perf_counter()
    try:
        next(resumed.iterate(start=1))
    finally:
        resumed.close()
    startup_s = time.perf_counter() - start
    return startup_s, epoch_s


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        sample_bytes = 3 * 1024 * args.sample_kb // 3
        files = write(Path(tmp), args.shards, args.per_shard, sample_bytes)
        size = sum(f.stat().st_size for f in files)
        n = args.shards * args.per_shard
        print(
            f"{n} samples of {sample_bytes} bytes in {len(files)} tar shards "
            f"({size / 2**20:.0f} MiB, page cache warm), {args.workers} workers, batch {args.batch}"
        )
        best: dict[str, float] = {}
        sides = {
            "raw": lambda: plain(RawShards(files, args.per_shard), args, collate=list),
            "tar": lambda: project(tars.TarShards(files, decode), args),
            "plain": lambda: plain(Readings(n), args),
            "loader": lambda: project(Readings(n), args),
        }
        groups = [["raw", "tar"], ["plain", "loader"]]
        if args.before:
            old = before(args.before, Path(tmp))
            sides["tar-before"] = lambda: project(old.tars.TarShards(files, decode), args, old)
            sides["loader-before"] = lambda: project(Readings(n), args, old)
            groups = [["raw", "tar", "tar-before"], ["plain", "loader", "loader-before"]]
            if args.workers > 0:
                start_fork_server([NOW, old])
        for round_ in range(args.rounds):
            for group in groups:
                turn = round_ % len(group)  # each side first in turn
                for name in group[turn:] + group[:turn]:
                    speed = sides[name]()
                    best[name] = max(best.get(name, 0.0), speed)
                    print(f"round {round_} {name:13} {speed:10.0f} samples/s", flush=True)
    startup_s, epoch_s = resume_startup(args)
    print(
        f"resume after {args.consumed} samples: {startup_s:.2f} s to the first batch; "
        f"an epoch of {2 * args.consumed}: {epoch_s:.2f} s"
    )
    ratios = {
        "tar/raw": best["tar"] / best["raw"],
        "loader/plain": best["loader"] / best["plain"],
        "resume/epoch": startup_s / epoch_s,
    }
    print("  ".join(f"{k}: {v:.2f}" for k, v in ratios.items()) + f" ({args.consumed} samples)")
    if args.before:
        tar, loader = best["tar"] / best["tar-before"], best["loader"] / best["loader-before"]
        print(f"tar now/before: {tar:.3f}  loader now/before: {loader:.3f}")


if __name__ == "__main__":
    main()
