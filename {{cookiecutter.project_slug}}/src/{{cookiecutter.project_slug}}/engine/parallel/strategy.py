"""How the model is spread over the processes (`dist.strategy`): the one place that knows.

`ddp` (the default) keeps a whole copy of the model, its gradients and its optimizer state in
every process and averages the gradients (DistributedDataParallel); best while all of that fits
one GPU. `fsdp` (FSDP2, `fully_shard`) keeps only 1/N of each in each of N processes and gathers
a block's parameters just while that block runs: the model may be N times bigger, at the price
of more communication. The loop asks a strategy to build the model, to skip the gradient sync
on inner accumulation steps, for the gradient norm and for the checkpoint state; it never
asks which strategy it has.
"""

import hashlib
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from ...config import Config
from ...errors import CheckpointError, ConfigError
from ...task import Task
from .. import optim
from ..state.checkpoint import load_model
from ..state.initial_weights import InitialWeights
from . import distributed
from .distributed import DistEnv
from .runtime import autocast_dtype


class Stepped(Protocol):
    """What trains beside the model (`update.Update`): optimizers and averaged weights."""

    optimizers: list[torch.optim.Optimizer]

    @property
    def averaged_tensors(self) -> dict[str, torch.Tensor]:
        """The averaged weights by parameter name (empty when the task averages none)."""
        ...


@dataclass
class Optimizers:
    """Optimizers alone, without averaged weights: what `plan` and the benchmarks save."""

    optimizers: list[torch.optim.Optimizer]
    averaged_tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def place(net: nn.Module, device: torch.device) -> nn.Module:
    """Move a model built on the CPU to `device`; leave one that placed itself as it is.

    A task may build a model that already lives where it must (e.g. a quantised base that
    its library put on the GPU): moving such a model again fails or undoes the quantisation.
    """
    tensors = [*net.parameters(), *net.buffers()]
    if all(t.device.type == "cpu" for t in tensors):
        return net.to(device)
    return net


def recompute_in_backward(block: nn.Module) -> None:
    """Activation checkpointing: keep only the block's input, recompute the rest in backward.

    The forward is replaced on the instance, not wrapped in another module, so parameter
    names (and with them checkpoints and `model.init_from` files) stay as they were.
    """
    forward: Callable[..., Any] = block.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        # use_reentrant=False: the recommended variant; works with keyword arguments and
        # inputs that need no gradient. The RNG state is restored, so dropout repeats exactly.
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed


@contextmanager
def _unused_parameters_named(inner: AbstractContextManager[Any]) -> Iterator[None]:
    """DDP's error about parameters without a gradient as one line naming this project's key.

    torch's message names its own argument (`find_unused_parameters=True` of DDP); here the
    setting is `dist.find_unused_parameters`.
    """
    try:
        with inner:
            yield
    except RuntimeError as err:
        if "find_unused_parameters" not in str(err):
            raise
        raise ConfigError(
            "some parameters got no gradient in a step (frozen after the model was built, or a "
            "branch the loss does not use): set dist.find_unused_parameters=true"
        ) from None


def tensor_digest(named: Iterator[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, shapes, dtypes and bytes of full tensors, in the given order."""
    digest = hashlib.sha256()
    for name, tensor in named:
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        data = full.detach().cpu().contiguous()
        if data.dtype in {torch.bfloat16, torch.float16}:  # exact: a frozen base kept in 16 bits
            data = data.float()  # digests as in fp32, so a resume may change train.precision
        digest.update(f"{name}:{list(data.shape)}:{data.dtype};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


class Strategy:
    """`ddp` (and a single process): every process holds the whole model."""

    name = "ddp"
    sharded = False  # whether each process holds only a part of the state (DCP checkpoints)

    def __init__(self, cfg: Config, denv: DistEnv, device: torch.device) -> None:
        """Remember the settings; nothing is built yet."""
        self.cfg, self.denv, self.device = cfg, denv, device
        self.frozen_at_build: set[str] = set()
        self._digests: dict[tuple[str, ...], str] = {}
        self._ddp: DistributedDataParallel | None = None
        self.initial: InitialWeights | None = None  # model.init_from, read into the model

    def setup(self, task: Task) -> tuple[nn.Module, nn.Module]:
        """Build the task's model: (the model itself, the wrapped one that runs the steps)."""
        if self.cfg.model.init_from:  # built on meta, filled from the files once placed
            self.initial = InitialWeights(
                task,
                Path(self.cfg.model.init_from),
                self.cfg.run.seed,
                autocast_dtype(self.cfg.train.precision, self.device),
            )
        net = self.initial.build() if self.initial else self.materialise(task)
        if self.cfg.model.channels_last:
            net = net.to(memory_format=torch.channels_last)
        # A frozen base read from model.init_from never changes: checkpoints store a digest
        # of it instead of the weights (under LoRA adapters: most of the model), and evaluate
        # and export read it from those files again. Other frozen parameters (a teacher the
        # task built or loaded itself) are saved with the weights: nothing else could
        # restore them.
        base = {id(p) for p in task.pretrained_target(net).parameters()} if self.initial else set()
        self.frozen_at_build = {
            n
            for n, p in net.named_parameters(remove_duplicate=False)
            if not p.requires_grad and id(p) in base
        }
        blocks = task.blocks(net)
        if self.cfg.train.activation_checkpointing == "blocks":
            if not blocks:
                raise ConfigError(
                    f"train.activation_checkpointing: task {task.name} names no blocks "
                    "(override Task.blocks, or use 'none')"
                )
            for block in blocks:
                recompute_in_backward(block)
        model = self.wrap(net, blocks)
        if self.initial:
            self.initial.fill(net)
        if self.cfg.model.compile:
            model = torch.compile(model)
        return net, model

    def materialise(self, task: Task) -> nn.Module:
        """The task's model with its initial weights, on this process's device."""
        return place(task.build_model(), self.device)

    def wrap(self, net: nn.Module, blocks: list[nn.Module]) -> nn.Module:
        """DDP around the model when there are several processes."""
        del blocks  # DDP replicates the whole model
        if self.initial:  # built on meta: memory on the device, the initial weights fill it
            self.initial.allocate(net, self.device)
        if not self.denv.distributed:
            return net
        ddp = DistributedDataParallel(
            net,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=self.cfg.dist.find_unused_parameters,
            # Gradients are views into the all-reduce buckets, not a second copy beside them:
            # 4 B per parameter less, so the state is the 16 B/param that `plan` counts.
            gradient_as_bucket_view=True,
        )
        self._ddp = ddp
        return ddp

    def sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Context of one backward pass: gradients all-reduced only when `sync`."""
        if self._ddp is None:
            return nullcontext()
        return _unused_parameters_named(nullcontext() if sync else self._ddp.no_sync())

    def release(self) -> None:
        """Drop the DDP wrapper (its reducer holds the process group) before the group goes."""
        self._ddp = None

    def for_several(self, net: nn.Module, model: nn.Module) -> nn.Module:
        """The model that steps for several optimizers: under ddp the model itself.

        DDP's reducer expects a gradient for every parameter in every backward; a GAN's
        discriminator loss gives the generator none. So the steps run on the model itself
        and `reduce_grads` averages each optimizer's gradients before its step.
        """
        if self._ddp is None:
            return model
        self._ddp = None
        return torch.compile(net) if self.cfg.model.compile else net

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        """Average the gradients of `params` over the processes (several optimizers, ddp)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not self.denv.distributed or not grads:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        torch.distributed.all_reduce(flat)
        flat /= self.denv.world_size
        for grad, reduced in zip(
            grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
        ):
            grad.copy_(reduced)

    def grad_norm(self, params: list[nn.Parameter], clip: float) -> torch.Tensor:
        """The total gradient norm of `params`; their gradients scaled down to `clip` when > 0."""
        params = [p for p in params if p.grad is not None]
        norm = nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):  # sharded gradients: the sum of the shards' squares
            norm = norm.full_tensor()
        if clip > 0:
            nn.utils.clip_grads_with_norm_(params, clip, norm)
        return norm

    def local_finite(self, net: nn.Module) -> bool:
        """Whether this process's weights (or its shards of them) are all finite."""
        params = [
            (p.to_local() if isinstance(p, DTensor) else p).detach() for p in net.parameters()
        ]
        return bool(torch.stack([torch.isfinite(p).all() for p in params]).all())

    def all_finite(self, net: nn.Module) -> bool:
        """Whether every weight is finite (DDP keeps the copies equal: no collective)."""
        return self.local_finite(net)

    # --- checkpoint state -------------------------------------------------------------
    def frozen_keys(self, net: nn.Module) -> list[str]:
        """Parameters frozen since the model was built: left out of checkpoints."""
        return sorted(  # every name of a tied parameter: each is a state-dict key
            n
            for n, p in net.named_parameters(remove_duplicate=False)
            if n in self.frozen_at_build and not p.requires_grad
        )

    def frozen_digest(self, net: nn.Module, keys: Collection[str]) -> str:
        """Digest of the frozen parameters `keys` (cached: frozen weights do not change)."""
        index = tuple(sorted(keys))
        if index not in self._digests:
            weights = self.weights(net)
            self._digests[index] = tensor_digest((k, weights[k]) for k in index)
        return self._digests[index]

    def weights(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """The model's state dict as this process holds it."""
        weights: dict[str, torch.Tensor] = net.state_dict()
        return weights

    def state(self, net: nn.Module, stepped: Stepped) -> dict[str, Any]:
        """Model (without a frozen base), optimizer states and averaged weights, as saved.

        One optimizer's state is saved as it is, several as a list in their order.
        """
        skip = set(self.frozen_keys(net))
        weights = {k: v for k, v in net.state_dict().items() if k not in skip}
        states = [opt.state_dict() for opt in stepped.optimizers]
        found = {"model": weights, "optimizer": states[0] if len(states) == 1 else states}
        return found | ({"averaged": stepped.averaged_tensors} if stepped.averaged_tensors else {})

    def full_weights(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """Whole tensors on rank 0's CPU, without the frozen base (every rank calls this).

        Gathered tensor by tensor (fsdp): rank 0 holds what trains (LoRA: the adapters), never
        the frozen base, which the run's `model.init_from` has (`frozen_keys`).
        """
        skip, whole = set(self.frozen_keys(net)), {}
        for name, tensor in self.weights(net).items():
            if name in skip:
                continue
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if self.denv.is_main:
                whole[name] = full.detach().cpu()
        return whole

    def load(self, net: nn.Module, stepped: Stepped, state: dict[str, Any], source: str) -> None:
        """Load a checkpoint's model, optimizer states and averages (read by `checkpoint_io`)."""
        frozen = (state.get("frozen") or {}).get("keys", [])
        load_model(net, state["model"], source, skip=frozen)
        self.check_frozen(net, state.get("frozen"), source)
        saved = state["optimizer"]
        for opt, opt_state in zip(
            stepped.optimizers, saved if isinstance(saved, list) else [saved], strict=True
        ):
            opt.load_state_dict(optim.without_frozen(opt_state, opt))
        load_averaged(stepped, state, source)

    def check_frozen(self, net: nn.Module, frozen: dict[str, Any] | None, source: str) -> None:
        """Refuse a checkpoint whose frozen base is not the one this model was built with."""
        if not frozen or not frozen["keys"]:
            return
        if self.frozen_digest(net, frozen["keys"]) != frozen["digest"]:
            raise CheckpointError(
                f"{source}: the {len(frozen['keys'])} frozen parameters it left out differ "
                "from those of the model built now (another base model, model.init_from or "
                "task?); it cannot be resumed with them"
            )


class FSDP(Strategy):
    """`fsdp`: parameters, gradients and optimizer state sharded over the processes (FSDP2)."""

    name = "fsdp"
    sharded = True

    def __init__(self, cfg: Config, denv: DistEnv, device: torch.device) -> None:
        """Check the settings FSDP needs."""
        super().__init__(cfg, denv, device)
        dtype = autocast_dtype(cfg.train.precision, device)
        if dtype == torch.float16:  # loss scaling of sharded gradients: not supported here
            raise ConfigError("train.precision: fp16 is not supported with fsdp; use bf16")
        # bf16 parameters for compute and communication, gradients reduced in fp32: the
        # precision FSDP recommends; the sharded master weights and optimizer stay fp32.
        self.policy = MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None
        )

    def materialise(self, task: Task) -> nn.Module:
        """Rank 0 builds the model on the CPU; every other rank only its shapes (meta device).

        Rank 0's seeded weights are those ddp and a single process start from. The other
        ranks never hold the whole model: `wrap` gives them their shards of rank 0's values.
        """
        if self.denv.rank == 0:
            return task.build_model()
        with torch.device("meta"):
            return task.build_model()

    def wrap(self, net: nn.Module, blocks: list[nn.Module]) -> nn.Module:
        """`fully_shard` each block, then the rest, then fill every rank's shards from rank 0.

        One process: the model as it is, on the device.
        """
        if self.initial:  # every rank built on meta; the initial weights fill the shards
            sharded = self._shard(net, blocks) if self.denv.distributed else net
            return self.initial.allocate(sharded, self.device)
        if not self.denv.distributed:
            return place(net, self.device)
        # Rank 0's whole tensors stay referenced here until every rank has its shards; the
        # other ranks' (meta) state dict only names the keys.
        initial = net.state_dict()
        # Buffers left out of state dicts (e.g. a precomputed rotary table) are sent apart.
        transient = [name for name, _ in net.named_buffers() if name not in initial]
        self._shard(net, blocks)
        if self.denv.rank != 0:
            net.to_empty(device=self.device)  # allocates this rank's shards, uninitialised
        # Sent one tensor at a time; each rank keeps its shard of it (tied weights stay tied).
        set_model_state_dict(
            net,
            initial if self.denv.rank == 0 else {},
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        del initial
        buffers = dict(net.named_buffers())
        for name in transient:
            torch.distributed.broadcast(buffers[name], src=0)
        return net

    def _shard(self, net: nn.Module, blocks: list[nn.Module]) -> nn.Module:
        """`fully_shard` each block, then the rest (its parameters become DTensor shards)."""
        mesh = init_device_mesh(self.device.type, (self.denv.world_size,))
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=self.policy)
        fully_shard(net, mesh=mesh, mp_policy=self.policy)
        return net

    def sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Inner accumulation steps keep unreduced gradients; the last one reduce-scatters."""
        if isinstance(self._root, FSDPModule):
            self._root.set_requires_gradient_sync(sync)
        return nullcontext()

    def setup(self, task: Task) -> tuple[nn.Module, nn.Module]:
        """As for ddp; the sharded root is kept for the sync switch."""
        net, model = super().setup(task)
        self._root = net
        return net, model

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        """Nothing: the backward pass has reduce-scattered every gradient already."""
        del params

    def all_finite(self, net: nn.Module) -> bool:
        """Whether every shard on every process is finite (one all-reduce)."""
        return not distributed.any_rank([not self.local_finite(net)], self.device)[0]

    def weights(self, net: nn.Module) -> dict[str, torch.Tensor]:
        """The sharded parameters and buffers, whatever FSDP's state.

        After a forward pass the root's parameters are whole (and in the compute dtype) until
        resharded, which a state dict does first.
        """
        weights: dict[str, torch.Tensor] = get_model_state_dict(net)
        return weights

    def state(self, net: nn.Module, stepped: Stepped) -> dict[str, Any]:
        """Sharded state keyed by parameter names: it loads into any number of processes.

        Several optimizers share one state keyed by parameter names (they hold disjoint
        parameters); the averaged weights are shards like the parameters they average.
        """
        skip = set(self.frozen_keys(net))
        weights = {k: v for k, v in self.weights(net).items() if k not in skip}
        found = {
            "model": weights,
            "optimizer": get_optimizer_state_dict(net, stepped.optimizers),
        }
        return found | ({"averaged": stepped.averaged_tensors} if stepped.averaged_tensors else {})

    def load(self, net: nn.Module, stepped: Stepped, state: dict[str, Any], source: str) -> None:
        """Load the state `checkpoint_io` read into the sharded skeleton of `state`."""
        set_model_state_dict(net, state["model"], options=StateDictOptions(strict=False))
        self.check_frozen(net, state.get("frozen"), source)
        set_optimizer_state_dict(net, stepped.optimizers, state["optimizer"])
        load_averaged(stepped, state, source)


def load_averaged(stepped: Stepped, state: dict[str, Any], source: str) -> None:
    """The checkpoint's averaged weights into `stepped`'s (fsdp: read in place already)."""
    mine, saved = stepped.averaged_tensors, state.get("averaged") or {}
    if mine.keys() != saved.keys():
        raise CheckpointError(
            f"{source}: it holds averaged weights of {len(saved)} parameters, the task "
            f"averages {len(mine)} now (EMA added, removed or changed); use another run.name"
        )
    with torch.no_grad():
        for name, tensor in mine.items():
            if saved[name] is not tensor:
                tensor.copy_(saved[name])


def create(cfg: Config, denv: DistEnv, device: torch.device) -> Strategy:
    """The strategy named by `dist.strategy`."""
    return {"ddp": Strategy, "fsdp": FSDP}[cfg.dist.strategy](cfg, denv, device)
