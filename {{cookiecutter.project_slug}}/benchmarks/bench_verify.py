"""Benchmark `data verify` on a generated raw tree (default 1 GiB) in a temporary folder.

Measured side by side in one run, so the ratios hold on any machine:
  * SHA-256 over a buffer in memory, one thread (the hash speed limit of one core);
  * read + hash of every file, one thread, like `sha256sum` (the plain disk + hash speed);
  * `data freeze` (hashes everything), `data verify` served by the cache (in-process and as
    a fresh `python -m <package> data verify` process), and `data verify --full`.
CPU seconds are printed next to wall-clock seconds: on a busy machine they show the cost.
The files were just written, so they are read from the page cache unless the folder is on a
file system without one; pass --dir to measure a cluster file system.

    python benchmarks/bench_verify.py [--size-gib 1] [--layout mixed|small] [--dir /scratch/$USER]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = next((ROOT / "src").glob("*/data/rawdata.py")).parent.parent.name
rawdata = import_module(f"{PACKAGE}.data.rawdata")
MIB = 1 << 20


def make_tree(raw: Path, total: int, layout: str) -> int:
    """Write the tree; return the number of files.

    mixed: half the bytes in 64 MiB files, half in 256 KiB files;
    small: 16 KiB files only (an image data set), where per-file costs dominate.
    """
    block = hashlib.sha256(b"raw").digest() * (MIB // 32)  # hash speed ignores content
    if layout == "mixed":
        sizes = [64 * MIB] * (total // 2 // (64 * MIB)) + [MIB // 4] * (total // 2 // (MIB // 4))
    else:
        sizes = [16 * 1024] * (total // (16 * 1024))
    for index, size in enumerate(sizes):
        path = raw / f"part{index // 1024:03d}" / f"file{index:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            handle.write(index.to_bytes(8, "little"))  # every file differs
            written = 8
            while written < size:
                chunk = block[: min(MIB, size - written)]
                handle.write(chunk)
                written += len(chunk)
    return len(sizes)


def timed(func, *args, **kwargs) -> tuple[float, float, object]:
    """Wall-clock seconds, CPU seconds of this process (all threads) and the result."""
    start, cpu = time.perf_counter(), time.process_time()
    result = func(*args, **kwargs)
    return time.perf_counter() - start, time.process_time() - cpu, result


def best(func, *args, repeat: int = 3, **kwargs) -> tuple[float, float, object]:
    """Fastest of ``repeat`` runs: the least disturbed by other work on the machine."""
    return min((timed(func, *args, **kwargs) for _ in range(repeat)), key=lambda r: r[0])


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def memory_sha256_rate(nbytes: int = 256 * MIB) -> float:
    buffer = bytes(nbytes)
    seconds, _, _ = best(hashlib.sha256, buffer)
    return nbytes / seconds


def sequential_rate(raw: Path) -> float:
    files = sorted(p for p in raw.rglob("*") if p.is_file())
    buffer = memoryview(bytearray(MIB))
    seconds, _, _ = best(lambda: [rawdata.sha256_file(p, buffer) for p in files])
    return sum(p.stat().st_size for p in files) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the tree")
    parser.add_argument("--layout", choices=["mixed", "small"], default="mixed")
    args = parser.parse_args()
    total = int(args.size_gib * 1024 * MIB)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-verify-") as tmp:
        project = Path(tmp)
        raw, manifest = project / "data" / "raw", project / rawdata.MANIFEST_PATH
        count = make_tree(raw, total, args.layout)
        size = sum(p.stat().st_size for p in raw.rglob("*") if p.is_file())
        gib = size / 1024 / MIB
        print(f"{args.layout} tree: {count} files, {gib:.2f} GiB in {raw}; {os.cpu_count()} CPUs")

        hash_rate = memory_sha256_rate()
        disk_rate = sequential_rate(raw)
        freeze_s, _, _ = timed(rawdata.freeze, raw, manifest, update=False)
        cached_s, cached_cpu, cached = best(rawdata.verify, raw, manifest)
        env = {**os.environ, "PROJECT_ROOT": str(project), "PYTHONPATH": str(ROOT / "src")}
        env.pop("DATA_DIR", None)
        command = [sys.executable, "-m", PACKAGE, "data", "verify"]
        start, cpu = time.perf_counter(), child_cpu()
        process = subprocess.run(command, env=env, capture_output=True, check=False)  # noqa: S603
        process_s, process_cpu = time.perf_counter() - start, child_cpu() - cpu
        full_s, full_cpu, full = best(rawdata.verify, raw, manifest, full=True)
        assert cached == full == [], (cached, full)
        assert process.returncode == 0, process.stdout + process.stderr
        full_rate = size / full_s

        rows = [
            ("sha256 in memory, 1 thread", f"{hash_rate / MIB:8.0f} MiB/s"),
            ("read + sha256, 1 thread", f"{disk_rate / MIB:8.0f} MiB/s"),
            ("data freeze (hash all, chmod)", f"{freeze_s:8.2f} s"),
            ("data verify --full, best of 3", f"{full_s:8.2f} s, {full_rate / MIB:.0f} MiB/s"),
            ("  its CPU time", f"{full_cpu:8.2f} s"),
            ("data verify cached, best of 3", f"{cached_s:8.3f} s (CPU {cached_cpu:.3f} s)"),
            ("data verify cached, new process", f"{process_s:8.3f} s (CPU {process_cpu:.3f} s)"),
            ("ratio --full / read+sha256", f"{full_rate / disk_rate:8.2f}"),
            ("ratio --full / sha256 1 thread", f"{full_rate / hash_rate:8.2f}"),
            ("ratio cached / --full", f"{cached_s / full_s:8.4f}"),
        ]
        for label, value in rows:
            print(f"{label:<33}{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
