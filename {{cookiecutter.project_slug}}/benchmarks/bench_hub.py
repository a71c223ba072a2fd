"""A hub model under fsdp as a user runs it: steps, save, resume, export, `plan` against it.

A Qwen2-layout folder with tied input and output embeddings is made from a config (random
weights in bf16, `--hidden` x `--layers`, about 1 B parameters by default; a BPE tokenizer
trained on data/raw/corpus.txt; needs the `hf` extra) and saved in shards with their index, as
a hub download is. Then the package's own commands run on it, each in its own process, with
the data and runs in a temporary folder:

- `prepare` cuts the corpus into windows with the folder's tokenizer;
- `train` under `dist.strategy=fsdp` for `--steps` steps from `model.init_from` (bf16), which
  saves a checkpoint at its end: samples/s from the run's summary, the save's seconds from the
  checkpoint's manifest;
- `train` again to two more steps: it resumes, and says in how many seconds it read the
  checkpoint;
- `export` (bf16): seconds; the folder loaded by `transformers` (`from_pretrained` with its
  loading info): no missing and no unexpected key, the embeddings still tied;
- `plan` for the same configuration: its predicted save and load seconds beside the measured.

The last line holds the figures:

    hub: <B> B tied qwen2 fsdp on <device>: samples/s=<n> save=<s> load=<s> export=<s>
    missing=<n> unexpected=<n> tied=<yes|no> plan/save=<r> plan/load=<r>

Usage: python benchmarks/bench_hub.py [--hidden 2048] [--layers 16] [--steps 6] [--device auto]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from hub_folders import trained_tokenizer  # noqa: E402
from under_test import PACKAGE  # noqa: E402  (the package's name, from pyproject.toml)

CORPUS = ROOT / "data" / "raw" / "corpus.txt"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=2048, help="model width")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers")
    parser.add_argument("--vocab", type=int, default=32000, help="embedding rows")
    parser.add_argument("--context", type=int, default=512, help="tokens per window")
    parser.add_argument("--batch", type=int, default=8, help="windows per step")
    parser.add_argument("--steps", type=int, default=6, help="steps of the first run")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    return parser.parse_args()


def make_folder(folder: Path, args: argparse.Namespace, device: str) -> int:
    """The tied Qwen2 folder with its tokenizer; its parameter count.

    The random weights are drawn on `device` (a GPU draws a billion in a blink, a CPU core
    takes many seconds); the folder holds them in bf16, as hub models are.
    """
    import transformers  # noqa: PLC0415  (the hf extra)

    # The corpus is small: a few thousand tokens; the embedding has --vocab rows all the same.
    fast = trained_tokenizer(folder, CORPUS, min(args.vocab, 4096))
    config = transformers.Qwen2Config(
        vocab_size=max(args.vocab, len(fast)),
        hidden_size=args.hidden,
        intermediate_size=round(args.hidden * 8 / 3 / 64) * 64 or 64,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 128),
        num_key_value_heads=max(1, args.hidden // 512),
        max_position_embeddings=max(4096, args.context + 1),
        tie_word_embeddings=True,
        eos_token_id=fast.eos_token_id,
    )
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="2GB")
    params = sum(p.numel() for p in model.parameters())
    del model  # the runs below are other processes: leave them the GPU's memory
    if device == "cuda":
        torch.cuda.empty_cache()
    return params


def cli(work: Path, *args: str) -> tuple[str, float]:
    """`python -m <package> args` with the data and runs below `work`: output and seconds."""
    env = {**os.environ, "DATA_DIR": str(work / "data"), "RUNS_DIR": str(work / "runs")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", PACKAGE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    print(done.stdout + done.stderr, flush=True)
    if done.returncode != 0:
        sys.exit(f"bench_hub: `{PACKAGE} {args[0]}` failed (exit {done.returncode})")
    return done.stdout + done.stderr, seconds


def number(pattern: str, text: str) -> float:
    """The number that `pattern`'s group finds in `text` (the last one)."""
    found = re.findall(pattern, text)
    if not found:
        sys.exit(f"bench_hub: no {pattern!r} in the output above")
    return float(found[-1])


def loaded(folder: Path) -> tuple[int, int, bool]:
    """Missing and unexpected keys when `transformers` loads `folder`; whether still tied."""
    import transformers  # noqa: PLC0415

    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True
    )
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return len(info["missing_keys"]), len(info["unexpected_keys"]), tied


def main() -> None:
    args = parse_args()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        work = Path(tmp)
        (work / "data" / "raw").mkdir(parents=True)
        (work / "data" / "raw" / CORPUS.name).write_bytes(CORPUS.read_bytes())
        base = work / "base"
        params = make_folder(base, args, device)
        print(f"{params / 1e9:.2f} B parameters (tied Qwen2) in {base}", flush=True)
        common = [
            "task.name=hub_lm",
            f"model.init_from={base}",
            f"task.context={args.context}",
            f"task.stride={args.context}",
            f"train.batch_size={args.batch}",
            "train.grad_accum_steps=1",
            f"train.device={device}",
            f"train.precision={'bf16' if device == 'cuda' else 'fp32'}",
            "dist.strategy=fsdp",
            "data.verify_raw=false",
            "run.name=hub",
            "run.figures=false",
            "run.progress=log",
        ]
        cli(work, "prepare", *common)
        cli(work, "train", *common, f"train.max_steps={args.steps}")
        summary = json.loads((work / "runs" / "hub" / "summary.json").read_text("utf-8"))
        manifests = sorted((work / "runs" / "hub").rglob("manifest.json"))
        save_s = max(json.loads(m.read_text("utf-8"))["seconds"] for m in manifests)
        out, _ = cli(work, "train", *common, f"train.max_steps={args.steps + 2}")
        load_s = number(r"resumed from step \d+ \([^)]*\) in ([\d.]+) s", out)
        _, export_s = cli(work, "export", "--run", "hub", "--dtype", "bf16")
        missing, unexpected, tied = loaded(work / "runs" / "hub" / "export")
        out, _ = cli(work, "plan", *common)
        plan_save = number(r"a checkpoint takes about ([\d.]+) s", out)
        plan_load = number(r"a resume reads it in ([\d.]+) s", out)
    print(
        f"hub: {params / 1e9:.2f} B tied qwen2 fsdp on {device}: "
        f"samples/s={summary['samples_per_s']} save={save_s:.2f}s load={load_s:.1f}s "
        f"export={export_s:.1f}s missing={missing} unexpected={unexpected} "
        f"tied={'yes' if tied else 'no'} plan/save={plan_save / save_s:.2f} "
        f"plan/load={plan_load / max(load_s, 0.05):.2f}"
    )


if __name__ == "__main__":
    main()
