"""What sharding, background checkpoints and memory-mapped loading cost and save, in one run.

Four measurements on CPU, each side by side in this run:

- `step`: seconds per training step of the test task `toy_tasks.tower` (a residual MLP tower,
  `--width` x `--depth`) in 2 processes (gloo), dist.strategy fsdp vs ddp, best of 3 rounds;
- `state`: bytes of parameters, gradients and Adam moments each rank holds, and its peak RSS,
  fsdp vs ddp (the same runs); `build`: the memory that building and sharding (fsdp) or
  wrapping (ddp) the model added at its peak on rank 1 (under fsdp only rank 0 builds the
  whole model; the others get their shards from it);
- `checkpoint`: training time lost to a checkpoint every few steps, run.async_checkpoint true
  vs false, each minus a run without periodic checkpoints (the trainer, one process, fsdp's
  sharded format);
- `resume`: seconds and added RSS of loading a `--load-mb` checkpoint file, memory-mapped (as
  the trainer does) vs read whole, each in a fresh process, before and after touching every
  tensor.

The last line is (one line)

    scale: fsdp/ddp step=<r> state=<r> rss=<r> build=<r> | lost async/sync=<r> |
    load mmap/full rss=<r>

Usage: python benchmarks/bench_scale.py [--width 1024] [--depth 8] [--load-mb 400]
"""

import argparse
import contextlib
import io
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # the test tasks (toy_tasks.tower)

import torch  # noqa: E402  (after the thread setting)
import torch.multiprocessing as mp  # noqa: E402

from under_test import PACKAGE, pkg  # noqa: E402

STEPS = 12


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024, help="tower width")
    parser.add_argument("--depth", type=int, default=8, help="tower blocks")
    parser.add_argument("--load-mb", type=int, default=400, help="size of the resume file")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in KiB."""
    status = Path("/proc/self/status").read_text(encoding="utf-8")
    return int(status.split(f"{field}:")[1].split()[0])


def tower(strategy: str, args: argparse.Namespace) -> list[str]:
    return [
        "task.name=toy_tasks.tower",
        f"model.hidden={args.width}",
        f"model.depth={args.depth}",
        f"dist.strategy={strategy}",
    ]


def _rank(rank: int, strategy: str, port: int, args: argparse.Namespace, out: Path) -> None:
    """One of two ranks: STEPS timed steps; writes seconds/step, state bytes and peak RSS."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    distributed = pkg("engine.parallel.distributed")
    denv = distributed.DistEnv(rank=rank, world_size=2, local_world_size=2, launcher="torchrun")
    distributed.init(denv, torch.device("cpu"), "gloo", 10.0)
    cfg = pkg("task").load_config(None, tower(strategy, args))
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    plan = pkg("engine.parallel.strategy").create(cfg, denv, torch.device("cpu"))
    Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")  # peak := now (Linux)
    before = memory_kib("VmRSS")
    net, model = plan.setup(task)
    built = (memory_kib("VmHWM") - before) * 1024
    optimizer = torch.optim.AdamW(net.parameters())
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    best = float("inf")
    for _ in range(3):
        distributed.barrier()
        start = time.perf_counter()
        for _ in range(STEPS):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            plan.grad_norm(list(net.parameters()), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # gradients kept: counted as state
        distributed.barrier()
        best = min(best, (time.perf_counter() - start) / STEPS)

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    state = sum(local(p) + local(p.grad) for p in net.parameters() if p.grad is not None)
    state += sum(local(v) for s in optimizer.state.values() for v in s.values() if v.dim())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"{strategy}-{rank}.json").write_text(json.dumps([best, state, rss, built]))
    distributed.shutdown()


def strategies(args: argparse.Namespace, out: Path) -> dict[str, list[float]]:
    found = {}
    for strategy in ("ddp", "fsdp"):
        mp.spawn(_rank, args=(strategy, free_port(), args, out), nprocs=2)
        ranks = [json.loads((out / f"{strategy}-{r}.json").read_text()) for r in range(2)]
        # The rank that needs most; the build figure of rank 1 (fsdp: not the one that builds).
        found[strategy] = [max(column) for column in zip(*ranks, strict=True)][:3]
        found[strategy].append(ranks[1][3])
    return found


def lost_to_checkpoints(args: argparse.Namespace, runs: Path) -> dict[str, float]:
    """Wall seconds of one short run per setting; periodic saves every 4 of 52 steps."""
    os.environ["RUNS_DIR"] = str(runs)
    load, train = pkg("task").load_config, pkg("engine.loop.trainer").train
    common = [
        *tower("fsdp", args),
        "data.verify_raw=false",
        "run.figures=false",
        "run.progress=log",
        "run.log_every_steps=1000",
        "train.batch_size=32",
        "train.epochs=4",
        "run.checkpoint_every_minutes=0",
    ]
    walls = {}
    for name, extra in [
        ("none", []),
        ("sync", ["run.checkpoint_every_steps=4"]),
        ("async", ["run.checkpoint_every_steps=4", "run.async_checkpoint=true"]),
    ]:
        cfg = load(None, [*common, *extra, f"run.name={name}"])
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            train(cfg)
        walls[name] = time.perf_counter() - start
    return {"sync": walls["sync"] - walls["none"], "async": walls["async"] - walls["none"]}


LOAD = """
import sys, time, torch
from pathlib import Path
sys.path.insert(0, {src!r})
from {package}.engine.state import checkpoint
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
before, start = rss(), time.perf_counter()
if sys.argv[2] == "mmap":
    state = checkpoint.load(Path(sys.argv[1]))
else:
    state = torch.load(sys.argv[1], weights_only=True)
loaded, after = time.perf_counter() - start, rss() - before
total = sum(float(t.sum()) for t in state["model"].values())
print(loaded, after, time.perf_counter() - start, rss() - before)
"""


def resume_load(args: argparse.Namespace, folder: Path) -> dict[str, list[float]]:
    n = args.load_mb * 2**20 // 4 // 64
    state = {"model": {f"w{i}": torch.randn(n) for i in range(64)}}
    path = pkg("engine.state.checkpoint").save(state, folder, 1, keep=1)
    code = LOAD.format(src=str(ROOT / "src"), package=PACKAGE)
    found = {}
    for how in ("full", "mmap"):
        done = subprocess.run(  # noqa: S603  (this interpreter, our own script)
            [sys.executable, "-c", code, str(path), how], capture_output=True, text=True, check=True
        )
        found[how] = [float(v) for v in done.stdout.split()]
    return found


def planned_state(args: argparse.Namespace) -> dict[str, float]:
    """`plan`'s state per rank of 2 for each strategy: weights, gradients and AdamW moments.

    Without its allowance for the gathered blocks under fsdp, which exist only while a block
    runs: the measured figure counts what stays.
    """
    plan = pkg("ops.plan")
    cfg = pkg("task").load_config(None, tower("ddp", args))
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    with torch.device("meta"):
        model = plan.count(task.build_model())
    full = plan.state_bytes(model, "ddp", 2, 4)
    return {"ddp": full, "fsdp": full / 2}


def main() -> None:
    args = parse_args()
    mib = 2**20
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        scale = strategies(args, folder)
        predicted = planned_state(args)
        for name, (step, state, rss, built) in scale.items():
            print(
                f"{name:5s} step {step * 1e3:7.1f} ms  state/rank {state / mib:7.1f} MiB "
                f"(plan {predicted[name] / mib:.1f} MiB: {predicted[name] / state:.2f}x)  "
                f"peak RSS/rank {rss / mib:7.1f} MiB  build peak rank 1 {built / mib:6.1f} MiB",
                flush=True,
            )
        lost = lost_to_checkpoints(args, folder / "runs")
        print(
            f"time lost to 13 checkpoints: sync {lost['sync']:.2f} s, async {lost['async']:.2f} s",
            flush=True,
        )
        loads = resume_load(args, folder / "load")
    for how, (t_load, rss, t_all, rss_all) in loads.items():
        print(
            f"load {how}: {t_load:.3f} s, +{rss / mib:.0f} MiB RSS; after touching every "
            f"tensor {t_all:.3f} s, +{rss_all / mib:.0f} MiB"
        )
    print(
        f"scale: plan/measured state ddp={predicted['ddp'] / scale['ddp'][1]:.2f} "
        f"fsdp={predicted['fsdp'] / scale['fsdp'][1]:.2f} | "
        f"fsdp/ddp step={scale['fsdp'][0] / scale['ddp'][0]:.2f} "
        f"state={scale['fsdp'][1] / scale['ddp'][1]:.2f} "
        f"rss={scale['fsdp'][2] / scale['ddp'][2]:.2f} "
        f"build={scale['fsdp'][3] / scale['ddp'][3]:.2f} | "
        f"lost async/sync={lost['async'] / max(lost['sync'], 1e-9):.2f} | "
        f"load mmap/full rss={loads['mmap'][1] / max(loads['full'][1], 1):.2f}"
    )


if __name__ == "__main__":
    main()
