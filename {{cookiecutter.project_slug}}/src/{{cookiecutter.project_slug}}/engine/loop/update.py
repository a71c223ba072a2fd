"""The update rule: how the micro-batches of one optimizer step become new weights.

The loop hands each micro-batch to `Update.add` and calls `Update.step` once per optimizer
step; it never sees optimizers, gradient scaling, clipping or the task's hooks. Two rules:

- one optimizer (the default): each micro-batch's forward and backward run at once, the
  gradients accumulate, and the step clips, steps and advances the schedule, exactly as a
  hand-written loop does;
- several named optimizers (`Task.optimizer` returns a dict, a GAN): the micro-batches of a
  step are kept, and each optimizer in turn runs its own loss over all of them, then steps.
  Under ddp the steps run on the model itself and each optimizer's gradients are averaged
  over the processes (`Strategy.reduce_grads`): DDP's reducer expects every parameter to get
  a gradient in every backward, which a GAN's discriminator step never gives the generator.

After the step the task's `after_step` runs (averaged weights). Every optimizer's state,
every schedule and the averaged weights are what `state`/`restore` hand to checkpoints.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
from torch import nn

from ...config import Config
from ...errors import CheckpointError, ConfigError, DataError
from ...task import Batch, Task, Where
from .. import optim
from ..parallel.runtime import autocast_dtype
from ..parallel.strategy import Strategy
from .train_scalars import TrainScalars
from .transfer import to_device


class Update:
    """The task's optimizers, schedules and gradient scaler, and how a step uses them."""

    def __init__(
        self,
        cfg: Config,
        task: Task,
        *,
        strategy: Strategy,
        models: tuple[nn.Module, nn.Module],
        total_steps: int | None,
        device: torch.device,
    ) -> None:
        """Build the optimizers and schedules of `models` (the model, the one that steps)."""
        self.cfg, self.task, self.strategy = cfg, task, strategy
        self.net, self.model = models
        made = task.optimizer(self.net)
        self.several = isinstance(made, dict)
        self.named = made if isinstance(made, dict) else {"": made}
        if self.several:
            self._check_named()
            self.model = strategy.for_several(self.net, self.model)
        self.optimizers = list(self.named.values())
        self.schedules = [task.schedule(o, total_steps) for o in self.optimizers]
        # Frozen now and in no optimizer (the default groups leave frozen parameters out):
        # one the task unfreezes later would never change, so `check_left_out` refuses it.
        held = {id(p) for o in self.optimizers for g in o.param_groups for p in g["params"]}
        self.left_out = [
            (n, p)
            for n, p in self.net.named_parameters()
            if not p.requires_grad and id(p) not in held
        ]
        self.dtype = autocast_dtype(cfg.train.precision, device)
        # fp32: no autocast context at all (a disabled one still costs microseconds a step).
        cast = partial(torch.autocast, device.type, self.dtype)
        self.autocast: Callable[[], AbstractContextManager[Any]] = (
            cast if self.dtype else nullcontext
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        self.accum, self.device = cfg.train.grad_accum_steps, device
        self.kept: list[Batch] = []  # several optimizers: this step's micro-batches
        self.grad_norm: torch.Tensor | None = None
        self.averaged = task.averaged
        if self.averaged is not None:
            self.averaged.attach(self.net)

    def _check_named(self) -> None:
        names = list(self.named)
        if not names or not all(n.isidentifier() for n in names):
            raise ConfigError(
                f"task {self.task.name}: optimizer() returned names {names}: give each "
                "optimizer a name of letters, digits and _"
            )
        seen: dict[int, str] = {}
        for name, opt in self.named.items():
            for group in opt.param_groups:
                for p in group["params"]:
                    if (other := seen.setdefault(id(p), name)) != name:
                        raise ConfigError(
                            f"task {self.task.name}: optimizers {other!r} and {name!r} share "
                            "parameters; each parameter belongs to one optimizer"
                        )

    def check_left_out(self) -> None:
        """Refuse a parameter left out of the optimizers as frozen that the task unfroze since."""
        if woken := [name for name, p in self.left_out if p.requires_grad]:
            raise ConfigError(
                f"task {self.task.name}: parameter {woken[0]} ({len(woken)} in all) was frozen "
                "when the optimizer was built, so no optimizer holds it, and trains now: it "
                "would never change; freeze it in on_epoch_start instead of build_model"
            )

    # --- what the rest of the engine reads --------------------------------------------
    @property
    def scalars(self) -> tuple[str, ...]:
        """The train-row scalars besides `loss`: each named optimizer's loss, the task's."""
        own = tuple(f"loss_{n}" for n in self.named) if self.several else ()
        return (*own, *self.task.train_scalars)

    def lrs(self) -> dict[str, float]:
        """`lr` (the first group's) and each named group's or optimizer's learning rate."""
        found = {"lr": self.optimizers[0].param_groups[0]["lr"]}
        for name, opt in self.named.items():
            if self.several:
                found[f"lr_{name}"] = opt.param_groups[0]["lr"]
            found.update({f"lr_{g['name']}": g["lr"] for g in opt.param_groups if "name" in g})
        return found

    def state(self) -> dict[str, Any]:
        """Schedules and the gradient scaler, for the checkpoint (optimizers: the strategy's)."""
        saved = [s.state_dict() for s in self.schedules]
        return {
            "scheduler": saved if self.several else saved[0],
            "scaler": self.scaler.state_dict(),
            "averaging": (
                {"updates": self.averaged.updates, "use": self.averaged.use}
                if self.averaged
                else None
            ),
            "averaged_names": list(self.averaged_tensors),  # read by export without the tensors
        }

    def restore(self, state: dict[str, Any], run: str, load: Callable[[], None]) -> None:
        """Optimizers, schedules, scaler and averaged weights from a checkpoint's `state`."""
        saved = state["scheduler"] if isinstance(state["scheduler"], list) else [state["scheduler"]]
        if len(saved) != len(self.schedules):
            raise CheckpointError(
                f"run {run}'s checkpoint holds {len(saved)} schedule(s), the task now "
                f"{len(self.schedules)}: the optimizers changed; use another run.name"
            )
        optim.restore(self.optimizers, self.schedules, saved, run, load)
        self.scaler.load_state_dict(state["scaler"])
        if self.averaged is not None:  # its tensors: read by `load` (the strategy checks them)
            self.averaged.updates = (state.get("averaging") or {}).get("updates", 0)

    @property
    def averaged_tensors(self) -> dict[str, torch.Tensor]:
        """The averaged weights, for the checkpoint (none when the task does not average)."""
        return self.averaged.tensors if self.averaged is not None else {}

    # --- one step ----------------------------------------------------------------------
    def add(self, batch: Batch, sync: bool, where: Where, window: TrainScalars) -> None:
        """One micro-batch of the step at `where` (all-reduced on the last one, `sync`)."""
        self.task.where = where
        if self.cfg.model.channels_last:
            batch = to_device(batch, self.device, channels_last=True)
        if self.several:
            self.kept.append(batch)
            return
        loss = self._backward(self.task.loss, batch, sync)
        window.add(loss, self.task.take_records())

    def _backward(self, loss_of: Callable[..., torch.Tensor], batch: Batch, sync: bool) -> Any:
        """Forward under autocast, then backward of the (accumulation-scaled) loss."""
        with self.strategy.sync(sync):
            with self.autocast():  # the forward only, as autocast asks
                loss = loss_of(self.model, batch)
            if loss.dim() != 0:
                which = "named_loss()" if self.several else "loss()"
                raise DataError(
                    f"task {self.task.name}: {which} must return a scalar (the batch mean), "
                    f"got shape {list(loss.shape)}"
                )
            self.scaler.scale(loss / self.accum if self.accum > 1 else loss).backward()
        return loss.detach()

    def step(self, log_now: bool, window: TrainScalars, steps_done: int) -> None:
        """Clip, step and clear each optimizer, advance the schedules, call `after_step`.

        The gradient norm is kept for the log (`log_now`); it stays on the device until then.
        `steps_done` counts the steps with this one.
        """
        if self.several:
            self._step_each(log_now, window)
        else:
            self._finish(self.optimizers[0], list(self.net.parameters()), log_now)
        self.scaler.update()
        for schedule in self.schedules:
            schedule.step()
        self.task.after_step(self.net, steps_done)

    def _finish(self, opt: torch.optim.Optimizer, params: list[nn.Parameter], log: bool) -> None:
        if self.cfg.train.grad_clip > 0 or log:
            self.scaler.unscale_(opt)
            self.grad_norm = self.strategy.grad_norm(params, self.cfg.train.grad_clip)
        self.scaler.step(opt)
        opt.zero_grad(set_to_none=True)

    def _step_each(self, log_now: bool, window: TrainScalars) -> None:
        """Each named optimizer in turn: its loss over the kept micro-batches, then its step."""
        losses: dict[str, list[torch.Tensor]] = {}
        norms: list[torch.Tensor] = []
        for name, opt in self.named.items():
            self.net.zero_grad(set_to_none=True)  # gradients of the earlier optimizers' losses
            loss_of = partial(self.task.named_loss, name)
            last = len(self.kept) - 1
            losses[name] = [
                self._backward(loss_of, batch, i == last) for i, batch in enumerate(self.kept)
            ]
            params = [p for group in opt.param_groups for p in group["params"]]
            self.strategy.reduce_grads(params)
            self._finish(opt, params, log_now)
            if log_now and self.grad_norm is not None:
                norms.append(self.grad_norm)
        records = self.task.take_records()
        for i in range(len(self.kept)):
            each = [(f"loss_{n}", values[i]) for n, values in losses.items()]
            total = torch.stack([v for _, v in each]).sum()
            window.add(total, [*(records if i == 0 else []), *each])
        self.kept = []
        if norms:  # the norm of all gradients, each optimizer's taken before its step
            self.grad_norm = torch.stack(norms).square().sum().sqrt()

    def drop(self) -> None:
        """Forget a partial step (the epoch ran out of batches before the step was full)."""
        self.kept = []
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
