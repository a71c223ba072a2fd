"""`export`: a run's weights as one safetensors file with the run's configuration beside it.

For inference or sharing: `<out>/model.safetensors` holds every tensor of the model (fp32 or
bf16), `<out>/config.toml` the configuration the run trained with, so the task's
`build_model` rebuilds the network and `model.init_from = "<out>"` starts another run from it.
safetensors holds tensors only: reading it runs no code, unlike a pickle.

The weights come from `load_weights_for_run`, the one place that knows where a run keeps its
final and best weights; it reads them through `checkpoint.py`'s public functions, so a change
of the checkpoint format changes that function only. A checkpoint that leaves out a frozen
base (a `frozen` entry naming its parameters) is completed from the run's `model.init_from`.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoint
from .config import from_dict, to_toml
from .data import swapped_in
from .errors import CheckpointError
from .pretrained import read_weights
from .settings import Settings
from .task import load_task

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODEL_FILE = "model.safetensors"


@dataclass
class RunWeights:
    """A run's full (unsharded) model weights on the CPU, with where they came from."""

    weights: dict[str, torch.Tensor]
    config: dict[str, Any]  # the run's configuration as `config.to_dict` wrote it
    step: int
    source: Path
    frozen: list[str]  # frozen parameters the checkpoint left out (its model.init_from has them)


def load_weights_for_run(run_dir: Path, which: str = "final") -> RunWeights:
    """The `final` weights (newest readable checkpoint) or the `best` ones (best.pt) of a run."""
    if which == "best":
        path = run_dir / "best.pt"
        if not path.is_file():
            raise CheckpointError(f"no {path}: the run kept no best weights (run.best_metric)")
        state = checkpoint.load(path)
        step = int(state["step"])
    else:
        path = run_dir / "checkpoints"
        latest = checkpoint.load_latest(path)
        if latest is None:
            raise CheckpointError(f"no checkpoint in {path}: nothing to export")
        state, step = latest, int(latest["position"]["step"])
    frozen = list((state.get("frozen") or {}).get("keys", []))
    return RunWeights(state["model"], state["config"], step, path, frozen)


def with_frozen_base(found: RunWeights, settings: Settings) -> dict[str, torch.Tensor]:
    """The weights of `found`, completed by the frozen parameters its checkpoint left out.

    A checkpoint of a run with a frozen base (LoRA) stores only what trains; the base is the
    run's `model.init_from`, read again and named as in the whole model (the task's
    `pretrained_target` may be a part of it, e.g. `base.` below the adapters).
    """
    if not found.frozen:
        return found.weights
    cfg = from_dict(found.config)
    if not cfg.model.init_from:
        raise CheckpointError(
            f"{found.source}: {len(found.frozen)} frozen parameters are left out and the run "
            "names no model.init_from to take them from"
        )
    task = load_task(cfg, settings)
    if task.processed_dir.is_dir():
        task.datasets(task.processed_dir)  # tasks may learn their shapes from the data
    with torch.device("meta"):  # only the names: nothing allocated
        net = task.build_model()
    target = task.pretrained_target(net)
    name = next(name for name, module in net.named_modules() if module is target)
    prefix = f"{name}." if name else ""
    path = Path(cfg.model.init_from)
    base = read_weights(path if path.is_absolute() else settings.project_root / path)
    named = {prefix + key: value for key, value in base.items()}
    if missing := [key for key in found.frozen if key not in named]:
        raise CheckpointError(f"model.init_from {path}: lacks the frozen parameter {missing[0]}")
    return {**{key: named[key] for key in found.frozen}, **found.weights}


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy; floating tensors in `dtype`, integer buffers (counters) as they are.

    A copy for every tensor: safetensors refuses tensors that share memory (tied weights).
    """
    target = dtype if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to(dtype=target, copy=True).contiguous()


def export_run(
    run_dir: Path, out_dir: Path, settings: Settings, which: str = "final", dtype: str = "fp32"
) -> Path:
    """Write `out_dir/model.safetensors` and `out_dir/config.toml`; return `out_dir`.

    Written into a temporary folder beside `out_dir` and renamed into place: an interrupted
    export leaves the previous one (or none), never half a file.
    """
    # Imported here: only `export` needs it; every other command starts without it.
    from safetensors.torch import save_file  # noqa: PLC0415

    found = load_weights_for_run(run_dir, which)
    weights = with_frozen_base(found, settings)
    tensors = {name: _cast(t, DTYPES[dtype]) for name, t in weights.items()}
    config_text = to_toml(from_dict(found.config))
    with swapped_in(out_dir) as tmp:
        metadata = {"run": run_dir.name, "step": str(found.step), "weights": which}
        save_file(tensors, tmp / MODEL_FILE, metadata=metadata)
        (tmp / "config.toml").write_text(config_text, encoding="utf-8")
        for path in tmp.iterdir():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    return out_dir
