"""Time `make install-cpu` on a fresh bake to its one-line message, where it cannot succeed.

Each case bakes the default project afresh and runs `make install-cpu` with this machine's pip
configuration set aside (PIP_CONFIG_FILE=/dev/null: none of its local mirrors), as on a
student's laptop:

- ``cuda mirror``: TORCH_INDEX names a local index that holds a CUDA build (a tiny fake
  ``2.14.1+cu130`` wheel): refused by the check;
- ``no torch index``: TORCH_INDEX names an address where nothing listens;
- ``no network``: no network at all (a new network namespace: root only, else skipped).

Prints, per case, the seconds to the message, what pip downloaded (a fresh pip cache, its
size afterwards), whether an environment was left, and the message itself.
Usage: python tools/bench_install.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_install import fake_wheel  # noqa: E402

BIN = Path(sys.executable).parent


def size_mb(folder: Path) -> float:
    """Megabytes of the files below `folder`."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def case(name: str, tmp: Path, prefix: list[str], **env: str) -> None:
    """Bake, run make install-cpu under `prefix` with `env`, print one line."""
    out = tmp / name.replace(" ", "-")
    subprocess.run(
        [str(BIN / "cookiecutter"), "--no-input", "-o", str(out), str(ROOT), "git_init=no"],
        check=True,
        capture_output=True,
    )
    [project] = out.iterdir()
    cache = out / "pip-cache"
    merged = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MAKE"))}
    merged |= {"PIP_CONFIG_FILE": os.devnull, "PIP_CACHE_DIR": str(cache), **env}
    start = time.perf_counter()
    done = subprocess.run(
        [*prefix, "make", "install-cpu"],
        cwd=project,
        env=merged,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("make install:")]
    left = "left" if (project / ".venv").exists() else "none"
    message = said[-1] if said else f"exit {done.returncode}, no message: {done.stderr[-300:]}"
    downloaded = size_mb(cache) if cache.exists() else 0.0
    print(f"{name:15s} {seconds:5.1f} s  pip fetched {downloaded:5.1f} MB  .venv {left}")
    print(f"    {message}")


def main() -> int:
    """Run the three cases and print their figures."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        fake_wheel(tmp / "cuda", "2.14.1+cu130")
        case("cuda mirror", tmp, [], TORCH_INDEX=(tmp / "cuda").as_uri())
        case("no torch index", tmp, [], TORCH_INDEX="http://127.0.0.1:9/whl/cpu")
        isolated = shutil.which("unshare") and subprocess.run(
            ["unshare", "-n", "true"], check=False, capture_output=True
        )
        if isolated and isolated.returncode == 0:
            case("no network", tmp, ["unshare", "-n"])
        else:
            print("no network      skipped: unshare -n needs root")
    return 0


if __name__ == "__main__":
    sys.exit(main())
