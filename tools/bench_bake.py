"""Time a default bake with each engine's command-line tool, side by side in one run.

Prints the median wall time of several bakes per engine's command (process start included,
as a user sees it) and, for comparison, of cookiecutter's and copier's Python APIs in this
process (imports already paid, as in a test suite).

``--against FOLDER`` bakes another template with the same commands in turn with this one and
prints the ratio of the medians per engine. scientific-python/cookie, for one, is in the
source distribution of sp-repo-review (``pip download --no-deps --no-binary :all:
sp-repo-review``); copier needs its answers (``--data`` is given to copier alone; cookiecutter
and cruft take the defaults): ``--data project_name=pkg --data org=me
--data full_name=Me --data email=me@example.org --data license=BSD --data backend=hatch
--data docs=sphinx --data vcs=true``.
Usage: python tools/bench_bake.py [--repeat N] [--against FOLDER [--data KEY=VALUE ...]]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import git, snapshot_template  # noqa: E402
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


def _timed_cli_bake(engine: str, template: Path, out: Path, answers: dict[str, str]) -> float:
    """Seconds one bake takes with an engine's command-line tool (process start included)."""
    start = time.perf_counter()
    result = bake(engine, template, out, answers)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"{engine}: {result.stderr}"
    return seconds


def against(folder: Path, answers: dict[str, str], repeat: int) -> None:
    """This template and another one, baked by each engine's tool in turn; ratio of medians."""
    with tempfile.TemporaryDirectory() as tmp:
        ours = snapshot_template(Path(tmp) / "ours")
        theirs = Path(tmp) / "theirs"
        shutil.copytree(folder, theirs)  # a repository, as copier and cruft read one
        git(theirs, "init", "-q", "-b", "main")
        git(theirs, "add", "-A", "-f")
        git(theirs, "commit", "-q", "-m", "snapshot")
        times: dict[tuple[str, str], list[float]] = {}
        for round_ in range(repeat):
            for engine in ENGINES:
                for side, template, given in (
                    ("ours", ours, {"git_init": "no"}),
                    ("theirs", theirs, answers if engine == "copier" else {}),
                ):
                    out = Path(tmp) / f"{side}-{engine}-{round_}"
                    seconds = _timed_cli_bake(engine, template, out, given)
                    times.setdefault((engine, side), []).append(seconds)
    sums = dict.fromkeys(("ours", "theirs"), 0.0)
    for engine in ENGINES:
        mine, other = (statistics.median(times[engine, side]) for side in sums)
        print(f"{engine:13s} this {mine:.3f} s  theirs {other:.3f} s  ratio {mine / other:.2f}")
        sums["ours"] += mine
        sums["theirs"] += other
    mine, other = sums.values()
    print(f"{'all three':13s} this {mine:.3f} s  theirs {other:.3f} s  ratio {mine / other:.2f}")


def main() -> int:
    """Run the benchmark and print one line per engine plus a summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another template's folder")
    parser.add_argument("--data", action="append", default=[], help="KEY=VALUE for --against")
    args = parser.parse_args()
    if args.against:
        against(args.against, dict(item.split("=", 1) for item in args.data), args.repeat)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        template = snapshot_template(Path(tmp) / "template")
        apis = ("cookiecutter", "copier")
        times: dict[str, list[float]] = {n: [] for n in (*ENGINES, *(f"{a}-api" for a in apis))}
        for round_ in range(args.repeat):  # engines interleaved, so load hits all alike
            for name in ENGINES:
                out = Path(tmp) / f"{name}-{round_}"
                times[name].append(_timed_cli_bake(name, template, out, {"git_init": "no"}))
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
