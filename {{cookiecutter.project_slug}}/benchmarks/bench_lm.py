"""A causal language model through the trainer vs a hand-written loop, eager and compiled.

The model is the `lm` example's `CausalLM` (byte vocabulary, learned positions, pre-norm
blocks), by default the 0.8B configuration of the GPU day: hidden 2048, depth 16, context
512, bf16 autocast, AdamW, batches of random tokens already on the device. Side by side,
interleaved, for eager and for `torch.compile`:

- `raw`: the usual loop written by hand (zero_grad, forward under autocast, loss, backward,
  step), the model compiled the same way where compiled;
- `trainer`: this package's trainer on the same model and data (the in-memory path), its
  speed as it logs it in metrics.csv.

Both sides run `--steps` steps and count the second half only: the first half warms up
(compiles). Each side's figure is its best round (other load only slows a round down). MFU
counts 6 N FLOPs per token (N: the parameters; forward and backward of the matmuls,
attention's own left out) against the GPU's dense bf16 peak (`--peak-tflops`, or known from
its name). The last line is

    lm: <params>M params eager trainer/raw=<r> mfu=<p>% raw_mfu=<p>% | compiled ...

Usage: python benchmarks/bench_lm.py [--device auto] [--hidden 2048] [--depth 16]
       [--context 512] [--batch 8] [--steps 20] [--rounds 3] [--peak-tflops 0]
"""

import argparse
import contextlib
import csv
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from under_test import pkg  # noqa: E402  (the package under test, found via pyproject.toml)

Task, Datasets, trainer = pkg("task").Task, pkg("task").Datasets, pkg("engine.loop.trainer")
CausalLM = pkg("blocks.transformer").CausalLM
VOCAB, HEADS, LR = 256, 16, 3e-4
# Dense bf16 peak of one GPU, TFLOP/s, by a part of its name (the vendors' data sheets).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A40": 150.0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="0: from the GPU's name")
    return parser.parse_args()


def model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    return CausalLM(
        VOCAB, args.context, width=args.hidden, depth=args.depth, heads=HEADS, dropout=0.0
    )


def tokens(args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """Random windows of context + 1 tokens, one batch a step, on the device."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (args.batch * args.steps, args.context + 1), generator=g)
    return ids.to(device)


def next_token_loss(net: nn.Module, window: torch.Tensor) -> torch.Tensor:
    logits = net(window[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten())


class Tokens(Task):
    """The same model and data as a task of this package."""

    args: argparse.Namespace
    data: torch.Tensor

    def datasets(self, data_dir: Path) -> "Datasets":
        del data_dir
        held = TensorDataset(self.data[: self.args.batch])
        return Datasets(train=TensorDataset(self.data), val=held, test=held)

    def build_model(self) -> nn.Module:
        return model(self.args)

    def loss(self, model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return next_token_loss(model, batch[0])

    def evaluate(self, model: nn.Module, batch: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss_sum": next_token_loss(model, batch[0]).detach(), "n": torch.tensor(1.0)}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        return {"loss": float(sums["loss_sum"] / sums["n"])}


def raw_loop(
    args: argparse.Namespace, device: torch.device, data: torch.Tensor, compiled: bool
) -> float:
    """The hand-written loop; tokens/s of its second half of steps."""
    net = model(args).to(device)
    step_net = torch.compile(net) if compiled else net
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, fused=device.type == "cuda")
    dtype = torch.bfloat16

    def step(window: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype):
            loss = next_token_loss(step_net, window)
        loss.backward()
        optimizer.step()

    batches = data.split(args.batch)
    timed = batches[len(batches) - args.steps // 2 :]
    for window in batches[: len(batches) - len(timed)]:
        step(window)
    sync(device)
    start = time.perf_counter()
    for window in timed:
        step(window)
    sync(device)
    return len(timed) * args.batch * args.context / (time.perf_counter() - start)


def with_trainer(
    args: argparse.Namespace, device: torch.device, data: torch.Tensor, compiled: bool
) -> float:
    """The trainer on the same work; tokens/s of its second half of steps, as it logs them."""
    cfg = pkg("task").load_config(
        None,
        [
            f"model.compile={'true' if compiled else 'false'}",
            f"train.batch_size={args.batch}",
            "train.epochs=1",
            f"train.lr={LR}",
            "train.schedule=constant",
            "train.warmup_steps=0",
            "train.grad_clip=0",
            "train.precision=bf16",
            f"train.device={device.type}",
            "data.in_memory=yes",
            "data.num_workers=0",
            "run.figures=false",
            "run.progress=log",
            f"run.log_every_steps={args.steps - args.steps // 2}",  # then the second half
            "run.checkpoint_every_minutes=0",
            "run.keep_checkpoints=1",
            "data.verify_raw=false",
            f"run.name=lm-{time.monotonic_ns()}",
        ],
    )
    task = Tokens(cfg, pkg("settings").get_settings())
    task.args, task.data = args, data
    with contextlib.redirect_stdout(io.StringIO()):  # its log lines are not the point here
        trainer.train(cfg, task)
    with (task.settings.runs_dir / cfg.run.name / "metrics.csv").open(encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row["phase"] == "train"]
    return float(rows[-1]["samples_per_s"]) * args.context


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak(args: argparse.Namespace, device: torch.device) -> float:
    """The device's dense bf16 peak in FLOP/s (0 where unknown: no MFU printed)."""
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for part, tf in PEAK_TFLOPS.items() if part in name), 0.0)


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    params = sum(p.numel() for p in model(args).parameters())
    data = tokens(args, device)
    flops = peak(args, device)
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PROJECT_ROOT"] = tmp  # trainer runs go to a throw-away place
        for compiled in (False, True):
            best = {"raw": 0.0, "trainer": 0.0}
            for round_ in range(args.rounds):
                order = ["raw", "trainer"] if round_ % 2 == 0 else ["trainer", "raw"]
                for side in order:
                    run = raw_loop if side == "raw" else with_trainer
                    best[side] = max(best[side], run(args, device, data, compiled))
            name = "compiled" if compiled else "eager"
            found[name] = best
            print(
                f"{name}: raw {best['raw']:.0f} tokens/s, trainer {best['trainer']:.0f} "
                f"tokens/s: trainer/raw {best['trainer'] / best['raw']:.2f}",
                flush=True,
            )

    def mfu(speed: float) -> str:
        return f"{6 * params * speed / flops:.0%}" if flops else "n/a"

    print(
        f"lm: {params / 1e6:.0f}M params on {device.type} "
        + " | ".join(
            f"{name} trainer/raw={b['trainer'] / b['raw']:.2f} mfu={mfu(b['trainer'])} "
            f"raw_mfu={mfu(b['raw'])}"
            for name, b in found.items()
        )
    )


if __name__ == "__main__":
    main()
