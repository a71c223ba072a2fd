"""A run's weights on the CPU: the one place that knows where a run keeps them.

`ModelTensors` reads a run's final weights (its newest intact checkpoint) or its best ones
(`best.pt`) a few tensors at a time, never the optimizer state, through `checkpoint.py`'s
public functions, so a change of the checkpoint format changes this module only: `export`
(ops/export.py) streams a model of any size through it. A checkpoint that leaves out a frozen
base (a `frozen` entry naming its parameters) is completed from the run's `model.init_from`
(`with_frozen_base`, for `evaluate`, which needs the whole model).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...data.pretrained import FIELD, read_weights
from ...errors import CheckpointError
from ...settings import Settings
from ...task import Task, config_from_dict, load_task
from . import checkpoint
from .initial_weights import tie_groups


@dataclass
class RunWeights:
    """A run's full (unsharded) model weights on the CPU, with where they came from."""

    weights: dict[str, torch.Tensor]
    config: dict[str, Any]  # the run's configuration as `config.to_dict` wrote it
    step: int
    source: Path
    frozen: list[str]  # frozen parameters the checkpoint left out (its model.init_from has them)


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
    task, net = model_on_meta(found.config, settings)
    prefix = target_prefix(task, net)
    path = Path(cfg.model.init_from)
    base = read_weights(path if path.is_absolute() else settings.project_root / path, FIELD)
    named = {prefix + key: value for key, value in base.items()}
    for group in tie_groups(net):  # a tied tensor may be stored under one of its names only
        if present := [n for n in group if n in named]:
            named.update(dict.fromkeys(group, named[present[0]]))
    if missing := [key for key in found.frozen if key not in named]:
        raise CheckpointError(f"model.init_from {path}: lacks the frozen parameter {missing[0]}")
    return {**{key: named[key] for key in found.frozen}, **found.weights}


def model_on_meta(config: dict[str, Any], settings: Settings) -> tuple[Task, nn.Module]:
    """The run's task and its model's structure (meta device: names and shapes only)."""
    task = load_task(config_from_dict(config), settings)
    if task.processed_dir.is_dir():
        task.datasets(task.processed_dir)  # tasks may learn their shapes from the data
    with torch.device("meta"):
        return task, task.build_model()


def target_prefix(task: Task, net: nn.Module) -> str:
    """The prefix of `pretrained_target`'s names in the whole model (e.g. "base.")."""
    target = task.pretrained_target(net)
    name = next(name for name, module in net.named_modules() if module is target)
    return f"{name}." if name else ""


class ModelTensors:
    """The model tensors of a run's final or best weights, read a few at a time.

    The final weights are the newest checkpoint whose checksums hold (a damaged one is named
    and the one before it used, as on resume). A checkpoint file is memory-mapped and a
    sharded one read by name: the optimizer state is never read.
    """

    def __init__(self, run_dir: Path, which: str = "final") -> None:
        """Find the checkpoint and read its small records (step, configuration, frozen)."""
        self.path = _intact(run_dir, which)
        self._pickled: dict[str, torch.Tensor] | None = None
        if self.path.is_dir():
            from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415

            meta: dict[str, Any] = torch.load(self.path / "meta.pt", weights_only=True)
            stored = FileSystemReader(str(self.path)).read_metadata()
            paths = stored.planner_data or {}
            self.shapes = {
                ".".join(paths[key][1:]): list(md.size)
                for key, md in stored.state_dict_metadata.items()
                if paths.get(key, ("",))[0] == "model"
            }
        else:
            meta = checkpoint.load(self.path)
            self._pickled = used_weights(meta)
            self.shapes = {k: list(v.shape) for k, v in self._pickled.items()}
        # Averaged weights the run uses (an EMA with `use`) stand in for the trained ones.
        used = (meta.get("averaging") or {}).get("use", False)
        self.averaged = set(meta.get("averaged_names", [])) if used else set()
        self.config: dict[str, Any] = meta["config"]
        self.step = int(meta["step"] if "step" in meta else meta["position"]["step"])
        self.frozen: list[str] = list((meta.get("frozen") or {}).get("keys", []))

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The tensors `names`, whole, on the CPU."""
        if self._pickled is not None:
            return {name: self._pickled[name] for name in names}
        from torch.distributed.checkpoint.state_dict_loader import (  # noqa: PLC0415
            _load_state_dict_from_keys,
        )

        keys = {f"averaged.{n}" if n in self.averaged else f"model.{n}" for n in names}
        with checkpoint.alone():  # one process, no process group
            found = _load_state_dict_from_keys(keys, checkpoint_id=self.path)
        tensors: dict[str, torch.Tensor] = {**found.get("model", {}), **found.get("averaged", {})}
        return tensors


def used_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A checkpoint's model weights, its averaged ones in their place when the run uses them."""
    weights: dict[str, torch.Tensor] = state["model"]
    if (state.get("averaging") or {}).get("use"):
        return {**weights, **state["averaged"]}
    return weights


def _intact(run_dir: Path, which: str) -> Path:
    """best.pt, or the newest checkpoint whose files match their checksums."""
    if which == "best":
        path = run_dir / "best.pt"
        if not path.is_file():
            raise CheckpointError(f"no {path}: the run kept no best weights (run.best_metric)")
        return path
    problems = []
    for _, path in reversed(checkpoint.list_checkpoints(run_dir / "checkpoints")):
        try:
            problem = checkpoint.damaged(path, checkpoint.read_manifest(path))
        except CheckpointError as err:
            problem = str(err)
        if problem is None:
            return path
        problems.append(problem)
    found = f" ({'; '.join(problems)})" if problems else ""
    raise CheckpointError(f"no intact checkpoint in {run_dir / 'checkpoints'}{found}")
