"""`model.init_from` under any strategy: no process builds, holds or reads the whole model.

With `model.init_from` set, the model is built with its parameters on the meta device
(`parameters_on_meta`: shapes only, nothing allocated or initialised) and its buffers for real
(small; some, like a rotary table, are computed and stored in no file). The strategy then
places or shards it (`to_empty` allocates each process's part) and `InitialWeights.fill`
writes the values:

- every tensor of the task's `pretrained_target` from the files, each process reading only
  the slices it keeps (its shard under fsdp, whole tensors under ddp): safetensors files are
  memory-mapped, so 4 processes sharding a 16 GB model read 4 GB each;
- tied weights (an output layer sharing the embedding) are one parameter: the files may hold
  it under either name, or both (hub folders of tied models leave `lm_head.weight` out);
- the files' names are the task's `pretrained_name(name)` of the model's (default: the same),
  for checkpoints whose names differ from the model's;
- parameters outside the target (adapters, a new head): their module's `reset_parameters()`,
  run on a CPU copy of that module alone, seeded by `run.seed`: the same on every process and
  under every strategy;
- frozen parameters (a base under LoRA adapters) stay in the files' 16-bit dtype when the run
  computes in it (`train.precision` bf16, or fp16): they never change, so they need no fp32
  master copy, and an 8 B base takes 16 GB, not 32. Trainable parameters are fp32 masters.
"""

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ...data.pretrained import FIELD, WeightFiles
from ...errors import ConfigError
from ...task import Task
from .checkpoint import misfit


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within: every parameter a module registers is moved to the meta device at once.

    Buffers stay where they are made. A layer's constructor allocates its weight (untouched
    memory, freed at once) and initialises the meta copy (no work): a model of any size is
    built in seconds and a few MB.
    """
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def local_part(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """The part of `tensor` this process holds and where it lies in the whole tensor."""
    if not isinstance(tensor, DTensor):
        return tensor, tuple(slice(0, n) for n in tensor.shape)
    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return tensor.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def tie_groups(model: nn.Module) -> list[list[str]]:
    """State-dict names grouped by the tensor they name: tied parameters share one group."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    named = {n for group in groups.values() for n in group}
    buffers = [[name] for name in model.state_dict() if name not in named]
    return [*groups.values(), *buffers]


class InitialWeights:
    """Builds the task's model on meta and fills it from `model.init_from` once placed."""

    def __init__(
        self, task: Task, path: Path, seed: int, compute_dtype: torch.dtype | None = None
    ) -> None:
        """Remember where the weights are (relative paths from the project root).

        `compute_dtype`: the run's autocast dtype (None: fp32), for the frozen parameters.
        """
        self.task, self.seed, self.compute_dtype = task, seed, compute_dtype
        self.path = path if path.is_absolute() else task.settings.project_root / path
        self._buffers: dict[str, torch.Tensor] = {}
        self._fresh: dict[str, torch.Tensor] = {}
        self._ties: list[list[str]] = []

    def build(self) -> nn.Module:
        """The task's model, parameters on meta; buffers and the non-target values kept."""
        with parameters_on_meta():
            net = self.task.build_model()
        self._buffers = {name: b.detach().clone() for name, b in net.named_buffers()}
        self._fresh = self._outside_target(net)
        self._ties = [group for group in tie_groups(net) if len(group) > 1]
        if self.compute_dtype is not None:
            self._keep_frozen_in(self.compute_dtype, self.task.pretrained_target(net))
        return net

    def _keep_frozen_in(self, dtype: torch.dtype, target: nn.Module) -> None:
        """Frozen parameters of `target` that the files hold in `dtype` become `dtype` (meta)."""
        files, rename = WeightFiles(self.path, FIELD), self.task.pretrained_name
        names, params = files.names(), dict(target.named_parameters(remove_duplicate=False))
        for group in tie_groups(target):
            param = params.get(group[0])
            found = [rename(n) for n in group if rename(n) in names]
            if param is None or param.requires_grad or not found:
                continue  # a buffer, a trainable parameter, or one _load_target reports
            if files.dtype(found[0]) != dtype or param.dtype == dtype:
                continue
            kept = nn.Parameter(param.to(dtype), requires_grad=False)
            for name in group:  # tied names stay one parameter
                owner, _, leaf = name.rpartition(".")
                target.get_submodule(owner).register_parameter(leaf, kept)

    def allocate(self, net: nn.Module, device: torch.device) -> nn.Module:
        """Memory for the (placed or sharded) meta parameters on `device`; ties kept.

        `to_empty` gives each module a new parameter: one tied to another's would come apart
        (two tensors that train apart), so each tie is made again.
        """
        net.to_empty(device=device)
        for first, *others in self._ties:
            shared = net.get_parameter(first)
            for name in others:
                owner, _, leaf = name.rpartition(".")
                module = net.get_submodule(owner)
                if getattr(module, leaf) is not shared:
                    module.register_parameter(leaf, shared)
        return net

    def _outside_target(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """Initial values of the parameters outside `pretrained_target` (seeded, on the CPU)."""
        inside = {id(p) for p in self.task.pretrained_target(net).parameters()}
        fresh: dict[str, torch.Tensor] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for prefix, module in net.named_modules():
                own = [
                    (n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in inside
                ]
                if not own:
                    continue
                if not hasattr(module, "reset_parameters"):
                    raise ConfigError(
                        f"{FIELD}: {prefix}.{own[0][0]} is not in the pretrained part "
                        f"(Task.pretrained_target) and {type(module).__name__} has no "
                        "reset_parameters() to initialise it"
                    )
                twin = copy.deepcopy(module).to_empty(device="cpu", recurse=False)
                twin.reset_parameters()
                values = dict(twin.named_parameters(recurse=False))
                fresh.update((f"{prefix}.{n}".lstrip("."), values[n].detach()) for n, _ in own)
        return fresh

    def fill(self, net: nn.Module) -> None:
        """Values into the placed (or sharded) model: buffers, fresh parameters, the files'."""
        with torch.no_grad():
            buffers = dict(net.named_buffers())
            for name, value in self._buffers.items():
                buffers[name].copy_(value)
            params = dict(net.named_parameters())
            for name, value in self._fresh.items():
                local, index = local_part(params[name])
                local.copy_(value[index])
            self._load_target(self.task.pretrained_target(net))
        self._buffers, self._fresh = {}, {}

    def _load_target(self, target: nn.Module) -> None:
        """Each tensor of `target` (this process's part of it) from the files."""
        files, source = WeightFiles(self.path, FIELD), self.path
        rename = self.task.pretrained_name
        state, held = target.state_dict(), set[str]()
        missing, shapes, plan = [], [], []
        names = files.names()
        for group in tie_groups(target):
            found = [rename(n) for n in group if rename(n) in names]
            held.update(rename(n) for n in group)
            if not found:
                missing.append(group[0])
                continue
            tensor = state[group[0]]
            if files.shape(found[0]) != list(tensor.shape):
                shapes.append(f"{found[0]} {files.shape(found[0])} vs {list(tensor.shape)}")
            plan.append((found[0], tensor))
        unexpected = sorted(names - held)
        if missing or unexpected or shapes:
            raise misfit(f"{FIELD} {source}", missing, unexpected, shapes)
        for name, tensor in plan:
            local, index = local_part(tensor)
            if local.numel():
                local.copy_(files.read(name, index))
