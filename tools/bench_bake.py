"""Time a default bake with each engine's command-line tool, side by side in one run.

Prints the median wall time of several bakes per engine's command (process start included,
as a user sees it) and, for comparison, of cookiecutter's and copier's Python APIs in this
process (imports already paid, as in a test suite).
Usage: python tools/bench_bake.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import snapshot_template  # noqa: E402
from cookiecutter.main import cookiecutter  # noqa: E402
from copier import run_copy  # noqa: E402
from engines import ENGINES, bake  # noqa: E402


def _api_bake(engine: str, template: Path, out: Path) -> None:
    """Bake in this process (no interpreter start); hook output (fd 1) is discarded."""
    saved = os.dup(1)
    with open(os.devnull, "w") as sink:  # noqa: PTH123
        os.dup2(sink.fileno(), 1)
        try:
            if engine == "cookiecutter":
                cookiecutter(
                    str(template),
                    no_input=True,
                    output_dir=str(out),
                    extra_context={"git_init": "no"},
                )
            else:
                run_copy(
                    str(template),
                    str(out),
                    data={"git_init": "no"},
                    defaults=True,
                    unsafe=True,
                    quiet=True,
                )
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def main() -> int:
    """Run the benchmark and print one line per engine plus a summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        template = snapshot_template(Path(tmp) / "template")
        apis = ("cookiecutter", "copier")
        times: dict[str, list[float]] = {n: [] for n in (*ENGINES, *(f"{a}-api" for a in apis))}
        for round_ in range(args.repeat):  # engines interleaved, so load hits all alike
            for name in ENGINES:
                start = time.perf_counter()
                result = bake(name, template, Path(tmp) / f"{name}-{round_}", {"git_init": "no"})
                times[name].append(time.perf_counter() - start)
                assert result.ok, result.stderr
            for name in apis:
                start = time.perf_counter()
                _api_bake(name, template, Path(tmp) / f"{name}-api-{round_}")
                times[f"{name}-api"].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:18s} median {statistics.median(values):.3f} s  (min {min(values):.3f} s)")
    medians = " ".join(f"{n}={statistics.median(v):.2f}s" for n, v in times.items())
    print(f"default bake: {medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
