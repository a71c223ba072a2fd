"""Averaged weights (an exponential moving average), kept beside the model by the engine.

A task sets `self.averaged = EMA(decay, use=...)` and calls `self.averaged.update(model, step)`
in `after_step`. The average itself is PyTorch's (`torch.optim.swa_utils`' EMA function, the
one `AveragedModel` uses); this class adds what a resumable run needs that `AveragedModel`
lacks: the averages are plain tensors shaped as the parameters this process holds (shards
under fsdp), so checkpoints save, reshard and restore them with the model, and `swapped`
puts them into the model for validation without a second copy of the whole module.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.swa_utils import get_ema_multi_avg_fn


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor (its shard under fsdp), sharing its memory."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class EMA:
    """An exponential moving average of a model's trainable weights.

    `decay` is the weight of the old average at each update; with `warmup` the update after
    `step` steps uses `min(decay, (1 + step) / (10 + step))`, so that the average does not
    remember the random start for thousands of steps: `decay` takes over from step
    `(10 decay - 1) / (1 - decay)` (890 for 0.99). `use`: validation, `evaluate`, `export` and
    `model_figures` use the averaged weights instead of the trained ones (best.pt holds them too).
    """

    def __init__(self, decay: float, *, use: bool = True, warmup: bool = True) -> None:
        """Set the decay; the averages are allocated when the trainer attaches the model."""
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie between 0 and 1, got {decay}")
        self.decay, self.use, self.warmup = decay, use, warmup
        self.tensors: dict[str, torch.Tensor] = {}  # parameter name -> its average
        self.updates = 0  # updates so far (0: the next one copies the weights)

    def attach(self, model: nn.Module) -> None:
        """Allocate the averages as copies of the model's trainable parameters (the trainer)."""
        self.tensors = {
            name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad
        }
        self.updates = 0

    def decay_at(self, step: int) -> float:
        """The decay of the update after `step` optimizer steps."""
        return min(self.decay, (1 + step) / (10 + step)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Fold the model's current weights into the average (call it in `after_step`)."""
        params = dict(model.named_parameters())
        averages = [_local(t) for t in self.tensors.values()]
        current = [_local(params[name].detach()) for name in self.tensors]
        if self.updates == 0:  # as AveragedModel: the first update copies
            torch._foreach_copy_(averages, current)
        else:
            get_ema_multi_avg_fn(self.decay_at(step))(averages, current, self.updates)
        self.updates += 1

    @contextmanager
    def swapped(self, model: nn.Module) -> Iterator[None]:
        """The averaged weights in the model inside the block, its own ones again after it."""
        params = dict(model.named_parameters())
        targets = [_local(params[name].detach()) for name in self.tensors]
        averages = [_local(t) for t in self.tensors.values()]
        with torch.no_grad():
            kept = [t.clone() for t in targets]
            torch._foreach_copy_(targets, averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(targets, kept)


def swapped_in(averaged: EMA | None, model: nn.Module) -> AbstractContextManager[None]:
    """`averaged.swapped(model)` when the task averages and uses the average, else nothing."""
    return averaged.swapped(model) if averaged is not None and averaged.use else nullcontext()
