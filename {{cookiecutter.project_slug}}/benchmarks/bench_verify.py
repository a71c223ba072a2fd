"""Benchmark `data verify` on a generated raw tree (default 1 GiB) in a temporary folder.

Measured side by side in one run, so the ratios hold on any machine:
  * SHA-256 over a buffer in memory, one thread (the hash speed limit of one core);
  * read + hash of every file, one thread, like `sha256sum` (the plain disk + hash speed);
  * `data freeze` (hashes everything), `data verify` served by the cache (in-process and as
    a fresh `python -m <package> data verify` process), and `data verify --full`.
The files were just written, so they are read from the page cache unless the folder is on a
file system without one; pass --dir to measure a cluster file system.

    python benchmarks/bench_verify.py [--size-gib 1] [--dir /scratch/$USER]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = next((ROOT / "src").glob("*/rawdata.py")).parent.name
rawdata = import_module(f"{PACKAGE}.rawdata")
MIB = 1 << 20


def make_tree(raw: Path, total: int) -> int:
    """Half the bytes in 64 MiB files, half in 256 KiB files (many small ones); return count."""
    block = hashlib.sha256(b"raw").digest() * (MIB // 32)  # hash speed ignores content
    sizes = [64 * MIB] * (total // 2 // (64 * MIB)) + [MIB // 4] * (total // 2 // (MIB // 4))
    for index, size in enumerate(sizes):
        path = raw / f"part{index % 16:02d}" / f"file{index:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            handle.write(index.to_bytes(8, "little"))  # every file differs
            written = 8
            while written < size:
                chunk = block[: min(MIB, size - written)]
                handle.write(chunk)
                written += len(chunk)
    return len(sizes)


def timed(func, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = func(*args, **kwargs)
    return time.perf_counter() - start, result


def best(func, *args, repeat: int = 3, **kwargs) -> tuple[float, object]:
    """Fastest of ``repeat`` runs: the least disturbed by other work on the machine."""
    return min((timed(func, *args, **kwargs) for _ in range(repeat)), key=lambda r: r[0])


def memory_sha256_rate(nbytes: int = 256 * MIB) -> float:
    buffer = bytes(nbytes)
    seconds, _ = best(hashlib.sha256, buffer)
    return nbytes / seconds


def sequential_rate(raw: Path) -> float:
    files = sorted(p for p in raw.rglob("*") if p.is_file())
    seconds, _ = best(lambda: [rawdata.sha256_file(p) for p in files])
    return sum(p.stat().st_size for p in files) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to make the tree")
    args = parser.parse_args()
    total = int(args.size_gib * 1024 * MIB)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-verify-") as tmp:
        project = Path(tmp)
        raw, manifest = project / "data" / "raw", project / rawdata.MANIFEST_PATH
        count = make_tree(raw, total)
        size = sum(p.stat().st_size for p in raw.rglob("*") if p.is_file())
        gib = size / 1024 / MIB
        print(f"tree: {count} files, {gib:.2f} GiB in {raw.parent}; {os.cpu_count()} CPUs")

        hash_rate = memory_sha256_rate()
        disk_rate = sequential_rate(raw)
        freeze_s, _ = timed(rawdata.freeze, raw, manifest, update=False)
        cached_s, cached = best(rawdata.verify, raw, manifest)
        env = {**os.environ, "PROJECT_ROOT": str(project), "PYTHONPATH": str(ROOT / "src")}
        env.pop("DATA_DIR", None)
        command = [sys.executable, "-m", PACKAGE, "data", "verify"]
        start = time.perf_counter()
        process = subprocess.run(command, env=env, capture_output=True, check=False)  # noqa: S603
        process_s = time.perf_counter() - start
        full_s, full = best(rawdata.verify, raw, manifest, full=True)
        assert cached == full == [], (cached, full)
        assert process.returncode == 0, process.stdout + process.stderr
        full_rate = size / full_s

        print(f"sha256 in memory, 1 thread      {hash_rate / MIB:8.0f} MiB/s")
        print(f"read + sha256, 1 thread         {disk_rate / MIB:8.0f} MiB/s")
        print(f"data freeze (hash all, chmod)   {freeze_s:8.2f} s")
        print(f"data verify --full (best of 3)  {full_s:8.2f} s  {full_rate / MIB:6.0f} MiB/s")
        print(f"data verify, cached (in-proc)   {cached_s:8.3f} s")
        print(f"data verify, cached (process)   {process_s:8.3f} s  (goal: < 2 s)")
        print(f"ratio --full / read+sha256      {full_rate / disk_rate:8.2f}")
        print(f"ratio --full / sha256 1 thread  {full_rate / hash_rate:8.2f}")
        print(f"ratio cached / --full           {cached_s / full_s:8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
