"""A run's weights, whole and on the CPU: the one place that knows where a run keeps them.

`load_weights_for_run` reads a run's final weights (its newest readable checkpoint) or its best
ones (`best.pt`) through `checkpoint.py`'s public functions, so a change of the checkpoint
format changes this module only. A checkpoint that leaves out a frozen base (a `frozen` entry
naming its parameters) is completed from the run's `model.init_from` (`with_frozen_base`).
Used by `evaluate` and by `export` (ops/export.py).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.pretrained import read_weights
from ..errors import CheckpointError
from ..settings import Settings
from ..task import config_from_dict, load_task
from . import checkpoint


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
    cfg = config_from_dict(found.config)
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
