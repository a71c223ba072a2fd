"""Host memory and time to start from a hub folder under fsdp: sliced reads against whole ones.

A Llama-layout folder is made from a config (random weights, `--hidden` x `--layers`, saved in
shards with their index as a hub download is; needs the `hf` extra) in a temporary folder. Then,
for 1 and `--processes` processes on this machine (gloo on the CPU), each process sets up the
`hub_lm` model under `dist.strategy = "fsdp"` two ways, in separate runs:

- `whole`: how it was done before (and how a task that loads its weights itself does it): rank
  0 builds the whole model with random values, the others its shapes, rank 0's values are
  sent into the shards, then every process reads the whole files (`read_weights`) and keeps
  its slices;
- `sliced`: `model.init_from` as the trainer does it now (engine/state/initial_weights.py): every
  process builds on the meta device and reads only its own slices.

For each it prints the peak host memory the set-up added per process (anonymous memory,
sampled; Linux) and the seconds it took; the last line holds the ratios side by side:

    hub load: <P> processes <GB> GB model | rank 0 whole=<MiB> sliced=<MiB> (<x>) | ...

Usage: python benchmarks/bench_hub_load.py [--hidden 1024] [--layers 8] [--processes 2]
"""

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from under_test import pkg  # noqa: E402  (the package under test, found via pyproject.toml)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024, help="model width")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size")
    parser.add_argument("--processes", type=int, default=2, help="the larger process count")
    return parser.parse_args()


def make_folder(folder: Path, args: argparse.Namespace) -> int:
    """A Llama-layout folder with random weights; its size in bytes."""
    import transformers  # noqa: PLC0415  (the hf extra)

    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 256),
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="200MB")
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def _anon_kib() -> int:
    """This process's anonymous resident memory (Linux), in KiB.

    Not VmRSS: pages of a memory-mapped safetensors file count there while they are read,
    though the kernel may drop them at any time; the memory a process really holds is anon.
    """
    status = Path("/proc/self/status").read_text(encoding="utf-8")
    found = re.search(r"RssAnon:\s+(\d+) kB", status)
    return int(found[1]) if found else 0


class PeakAnon:
    """The highest anonymous memory while it runs (sampled every millisecond)."""

    def __enter__(self) -> "PeakAnon":
        self.before = self.peak = _anon_kib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, _anon_kib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _anon_kib())


@dataclass
class Job:
    """What each process of one measurement is told."""

    world: int
    port: int
    mode: str  # whole | sliced
    folder: Path  # the hub folder
    out: Path  # where each process writes its figures


def _rank(rank: int, job: Job) -> None:
    """One process: the set-up of `job.mode`; writes its peak memory and seconds."""
    world, port, mode, folder, out = job.world, job.port, job.mode, job.folder, job.out
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PROJECT_ROOT=str(out))
    distributed, strategy = pkg("engine.parallel.distributed"), pkg("engine.parallel.strategy")
    launcher = "torchrun" if world > 1 else "single"
    denv = distributed.DistEnv(rank, rank, world, world, launcher)
    distributed.init(denv, torch.device("cpu"), "gloo", 1.0)
    load = pkg("task").load_config
    common = ["task.name=hub_lm", "dist.strategy=fsdp", "data.verify_raw=false"]
    cfg = load(None, [*common, f"model.init_from={folder}"])
    task = pkg("task").load_task(cfg, pkg("settings").get_settings())
    plain = load(None, common)  # the strategy of `whole` knows no init_from
    start = time.perf_counter()
    with PeakAnon() as memory:
        if mode == "sliced":
            strategy.create(cfg, denv, torch.device("cpu")).setup(task)
        else:
            net, _ = strategy.create(plain, denv, torch.device("cpu")).setup(task)
            weights = pkg("data.pretrained").read_weights(folder)
            pkg("engine.state.checkpoint").load_model(task.pretrained_target(net), weights, "whole")
            del weights
        distributed.barrier()
    found = {"mib": (memory.peak - memory.before) / 1024, "s": time.perf_counter() - start}
    (out / f"{mode}-{world}-{rank}.json").write_text(json.dumps(found), encoding="utf-8")
    distributed.shutdown()


def main() -> None:
    args = parse_args()
    port = pkg("engine.parallel.distributed").rendezvous_port(os.getpid() % 100_000, 0)
    with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        folder, out = Path(tmp) / "model", Path(tmp)
        size = make_folder(folder, args)
        print(f"model folder: {size / 1e9:.2f} GB of fp32 safetensors in {folder.name}/")
        line = []
        for world in sorted({1, args.processes}):
            for mode in ("whole", "sliced"):
                mp.spawn(_rank, args=(Job(world, port, mode, folder, out),), nprocs=world)
                port += 1
            for rank in range(world):
                whole, sliced = (
                    json.loads((out / f"{m}-{world}-{rank}.json").read_text())
                    for m in ("whole", "sliced")
                )
                print(
                    f"{world} process(es), rank {rank}: whole {whole['mib']:.0f} MiB "
                    f"{whole['s']:.1f} s | sliced {sliced['mib']:.0f} MiB {sliced['s']:.1f} s"
                )
                line.append(
                    f"P={world} rank {rank} whole={whole['mib']:.0f} sliced={sliced['mib']:.0f} "
                    f"({sliced['mib'] / max(whole['mib'], 1):.2f})"
                )
        print(f"hub load: {size / 1e9:.2f} GB model | " + " | ".join(line))


if __name__ == "__main__":
    main()
