"""Many small image files vs the same bytes packed into shards, side by side in one run.

Writes N small PNG files (default 12,000 grey 16 x 16 images in `<class>/<n>.png` folders, the
layout of the `images` task) into a temporary folder on the disk under test, packs them with
`shards.write_shards`, then reads every image both ways, in a shuffled order as training
does: `files` opens and reads each file, `shards` takes its bytes from memory-mapped shards
(`shards.ShardReader`). Each side is measured reading only and reading plus PNG decoding, in
alternating order over several rounds; the best round counts. With `--cold` (root only) the
page cache is dropped before every measurement, which is closer to a first epoch on a
parallel file system, where every file open is a metadata request to a server. The last line
is the speed of shards over files (above 1: shards are faster)

    shards/files: read=<ratio> read+decode=<ratio>

Usage: python benchmarks/bench_shards.py [--images 12000] [--rounds 5] [--dir /path] [--cold]
"""

import argparse
import io
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from under_test import pkg  # noqa: E402  (the package under test, found via pyproject.toml)

shards = pkg("data.shards")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="disk to test (default: /tmp)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache (root)")
    return parser.parse_args()


def write_images(folder: Path, n: int) -> list[Path]:
    """N grey 16 x 16 PNG files with some structure, in ten class folders."""
    g = torch.Generator().manual_seed(0)
    paths = []
    for i in range(n):
        pixels = (torch.rand(16, 16, generator=g) * 64 + (i % 10) * 19).to(torch.uint8)
        path = folder / str(i % 10) / f"{i:06d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(pixels.numpy()).save(path)
        paths.append(path)
    return paths


def drop_caches() -> None:
    Path("/proc/sys/vm/drop_caches").write_text("3\n", encoding="ascii")


def decode(data: bytes) -> int:
    with Image.open(io.BytesIO(data)) as image:
        return len(image.tobytes())


def from_files(paths: list[Path], order: list[int], parse: bool) -> float:
    start = time.perf_counter()
    for i in order:
        data = paths[i].read_bytes()
        if parse:
            decode(data)
    return len(order) / (time.perf_counter() - start)


def from_shards(folder: Path, order: list[int], parse: bool) -> float:
    start = time.perf_counter()
    reader = shards.ShardReader(folder, "all")  # opening the index is part of the cost
    for i in order:
        data = reader.read(i)
        if parse:
            decode(data)
    return len(order) / (time.perf_counter() - start)


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        files_dir, shard_dir = Path(tmp) / "files", Path(tmp) / "shards"
        files_dir.mkdir()
        shard_dir.mkdir()
        paths = write_images(files_dir, args.images)
        count = shards.write_shards(paths, torch.zeros(len(paths)), shard_dir, "all", 64.0)
        size = sum(p.stat().st_size for p in paths)
        print(
            f"{len(paths)} PNG files, {size / 2**20:.1f} MiB, in {count} shard(s); "
            f"{'cold' if args.cold else 'warm'} page cache, disk of {tmp}"
        )
        order = list(range(len(paths)))
        random.Random(0).shuffle(order)  # noqa: S311  (an order, not a secret)
        best: dict[tuple[str, bool], float] = {}
        for round_ in range(args.rounds):
            sides = [("files", from_files, paths), ("shards", from_shards, shard_dir)]
            for parse in (False, True):
                for name, read, source in sides if round_ % 2 == 0 else sides[::-1]:
                    if args.cold:
                        drop_caches()
                    speed = read(source, order, parse)
                    best[name, parse] = max(best.get((name, parse), 0.0), speed)
                    what = "read+decode" if parse else "read"
                    print(f"round {round_} {name:6} {what:11} {speed:10.0f} images/s", flush=True)
    for (name, parse), speed in sorted(best.items()):
        print(f"best {name} {'read+decode' if parse else 'read'}: {speed:.0f} images/s")
    ratios = {
        what: best["shards", parse] / best["files", parse]
        for what, parse in (("read", False), ("read+decode", True))
    }
    print("shards/files: " + " ".join(f"{k}={v:.2f}" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
