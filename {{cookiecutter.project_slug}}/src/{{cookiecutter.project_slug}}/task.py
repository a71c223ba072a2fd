"""The seam between your research and the training machinery: the `Task` class.

A task says everything that is specific to one research problem: how raw data becomes
processed data, the train/val/test data sets, the model, the loss of a batch, the metrics, the
optimizer's parameter groups, what happens at the start of an epoch and which figures are
worth drawing. The trainer, checkpoints, distribution, stop signals, logging and the time
report call only these methods, so a new problem is a new module in `tasks/` plus a config file
in `configs/tasks/`, and no other file changes.

A task is chosen by the config key `task.name`: `digits` is the module `tasks/digits.py`; a
name with a dot is a full module path (`mylab.tasks.segmentation`). The module names its class
in `TASK = MyTask`. Task-specific settings are the fields of the class's `Options` dataclass,
set in the `[task]` section of the config and on the command line (`task.freeze_epochs=2`).

Optional hooks, each with the default behaviour when not overridden: `collate` (how samples
become a batch: padding variable-length samples), `optimizer` and `schedule` (AdamW with
warmup and a cosine or constant schedule; several named optimizers, each with its own loss,
for a GAN), `on_mode` (submodule modes after the trainer's `train()`/`eval()`, e.g. a frozen
backbone's BatchNorm kept in eval mode), `after_step` (once per optimizer step: an average of
the weights), `model_figures` (figures the model draws: generated samples).

`self.where` says where training is (the optimizer step, the epoch, the fraction of the
planned steps) for annealing, warm-ups and curricula; `self.averaged` (an `EMA`) holds
averaged weights that checkpoints keep and that validation, `evaluate` and `export` may use.

The one rule for random data augmentation: draw random numbers inside a data set's
`__getitem__` from torch, `random` or numpy (or from `sample_generator()`), never from a
generator object created elsewhere. Before it loads a batch, the loader seeds those three from
(run.seed, epoch, the batch's first sample index), so a batch gets the same augmentation
whichever worker loads it, and a resumed run sees exactly the samples an uninterrupted one
would. (Once per batch, not per sample: saving and seeding three generators costs tens of
microseconds, too much to spend on every sample of a fast input pipeline.)
"""

import ast
import hashlib
import importlib
import importlib.util
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from . import config
from .config import Config, field_types
from .data import pretrained
from .engine import optim
from .engine.loop.averaging import EMA
from .errors import ConfigError, DataError
from .settings import Settings

Batch = Any
"""What a DataLoader yields: a tensor, or tuples, lists and dicts of tensors (any nesting)."""


@dataclass
class Datasets:
    """The three splits as map-style data sets (`__len__` and `__getitem__`)."""

    train: Dataset
    val: Dataset
    test: Dataset

    def get(self, split: str) -> Dataset:
        """The data set of `split` ("train", "val" or "test")."""
        return {"train": self.train, "val": self.val, "test": self.test}[split]


@dataclass(frozen=True)
class Where:
    """Where training is, for the batch being trained (`Task.where`).

    The same for every micro-batch of one accumulated step, and restored on resume, so a
    schedule that reads it resumes exactly.
    """

    step: int = 0  # optimizer steps done before this one (0 for the first step)
    epoch: int = 0
    fraction: float | None = 0.0  # step / planned steps; None without a planned end (a stream)


@dataclass
class NoOptions:
    """A task without settings of its own."""


@runtime_checkable
class LowRankAdapted(Protocol):
    """A model whose linear layers carry low-rank adapters (`blocks/transformer.LoRA` is one).

    `export` merges each adapter into its layer's weight (`W + scale B A`) or writes the
    adapters as a `peft` folder; the checkpoint names are `base.*` and `adapters.<key>.a|b`.
    """

    base: nn.Module  # the adapted model (its names, less `base.`, are the export's)
    adapters: nn.ModuleDict  # key -> a (rank x inputs), b (outputs x rank), rank, alpha, scale
    layers: dict[str, str]  # adapter key -> the name in `base` of the linear layer it adapts


class Task(ABC):
    """Base class of every task: override the abstract methods, and others where needed.

    The trainer calls, in this order: `datasets`, `build_model`, `optimizer` (which calls
    `param_groups`), `schedule`, then per epoch `on_epoch_start`, `on_mode` and per batch
    `loss`; for validation and `evaluate`, `on_mode`, `evaluate` per batch, then `summarize`
    and `figures` on the sums added over all batches and processes. `collate` turns the
    samples of every batch into the batch the other methods get.
    """

    Options: ClassVar[type] = NoOptions
    """Dataclass of the task's own settings (the `[task]` section of the config)."""

    metrics: ClassVar[tuple[str, ...]] = ("loss",)
    """Names `summarize` returns, in the order of the metrics.csv columns; "loss" first."""

    train_scalars: ClassVar[tuple[str, ...]] = ()
    """Names `loss` may `record` for the train rows (columns of metrics.csv, tracker keys)."""

    keep_limit_mb: ClassVar[float] = 512.0
    """The most `keep` may hold over one pass of a split, all processes together, in MB."""

    averaged: EMA | None = None
    """Averaged weights, when the task sets `self.averaged = EMA(...)` in `__init__` and
    updates them in `after_step`: kept in checkpoints, and used by validation, `evaluate`,
    `export` and `model_figures` when the EMA's `use` says so."""

    def __init__(self, cfg: Config, settings: Settings) -> None:
        """Keep the configuration; `self.options` holds the `[task]` settings, typed."""
        self.cfg, self.settings = cfg, settings
        self.options: Any = self.Options(**cfg.task.options)
        pretrained.set_task_options(self.options)  # read_weights names the option of a path
        self.where = Where()  # set by the trainer before each batch it trains on

    def __getstate__(self) -> dict[str, Any]:
        """The task as a stream's DataLoader workers receive it (its `collate` is a method).

        Without its training state: the averaged weights (a copy of the model) and what
        `record` and `keep` hold stay in the training process.
        """
        return {
            k: v for k, v in self.__dict__.items() if k not in {"averaged", "_recorded", "_kept"}
        }

    @property
    def name(self) -> str:
        """The task's name (`task.name`)."""
        return self.cfg.task.name

    @property
    def processed_dir(self) -> Path:
        """Where `prepare` leaves this task's processed data: data/processed/<task name>."""
        return self.settings.processed_dir / self.name

    # --- data ---------------------------------------------------------------------------
    def prepare(self, out_dir: Path) -> str:
        """Read `settings.raw_dir` (read-only) and write processed files into `out_dir`.

        `out_dir` is a fresh temporary folder that replaces `processed_dir` only when this
        returns, so a failure leaves the previous processed data intact. Return one line that
        describes what was written. The default: nothing to prepare.
        """
        del out_dir
        return f"task {self.name}: nothing to prepare"

    @abstractmethod
    def datasets(self, data_dir: Path) -> Datasets:
        """The train/val/test data sets, read from `data_dir`.

        `data_dir` is the processed folder or its copy on node-local disk. A `TensorDataset`
        that fits in memory is fed from the device without a DataLoader; any other data set
        goes through DataLoader workers.
        """

    def collate(self, samples: list[Any]) -> Batch:
        """Samples -> one batch (in DataLoader workers). Default: torch's `default_collate`.

        Override it for samples that do not stack, e.g. to pad variable-length sequences to
        the longest of the batch and return a mask. A task that overrides it is always fed
        through the DataLoader (not from in-memory tensors), so every batch passes here.
        """
        return default_collate(samples)

    # --- model and optimisation -----------------------------------------------------------
    @abstractmethod
    def build_model(self) -> nn.Module:
        """A new model with its initial weights (called after `datasets`).

        Under `dist.strategy = "fsdp"` ranks other than 0 call it inside `torch.device("meta")`:
        their tensors hold no values (rank 0's are copied into their shards), so it must not
        read them. With `model.init_from` every process builds the parameters on meta
        (engine/state/initial_weights.py) and the files fill them.
        """

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """The optimizer's parameter groups.

        A group may set its own "lr" and a "name" (each named group's learning rate is logged
        as `lr_<name>`). Default: the parameters that train when the optimizer is built
        (`requires_grad`: a teacher or base frozen in `build_model` has nothing to step), with
        weight decay on matrices and kernels only, not on biases and norm scales. A parameter
        left out stays out: to unfreeze one later, freeze it in `on_epoch_start` instead.
        """
        trained = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in trained if p.ndim >= 2]
        rest = [p for p in trained if p.ndim < 2]
        return [
            {"params": decay, "weight_decay": self.cfg.train.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ]

    def optimizer(
        self, model: nn.Module
    ) -> torch.optim.Optimizer | dict[str, torch.optim.Optimizer]:
        """The optimizer over `param_groups(model)`. Default: AdamW with `train.lr`.

        Any `torch.optim.Optimizer` works (SGD with momentum, Adafactor, an 8-bit optimizer);
        its state is checkpointed and resumed with it.

        A dict names several optimizers over disjoint parameters (a GAN's discriminator and
        generator). Each step then runs them in the dict's order on the same batch: optimizer
        `name` steps on `named_loss(name, model, batch)`, with its own schedule and clipping,
        and each loss gets its own column (`loss_<name>`; `loss` is their sum).
        """
        return optim.adamw(self.param_groups(model), self.cfg.train.lr, model)

    def schedule(
        self, optimizer: torch.optim.Optimizer, total_steps: int | None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The learning rate schedule, stepped once per optimizer step.

        Default: linear warmup over `train.warmup_steps`, then `train.schedule` (cosine decay
        to zero at `total_steps`, or constant). `total_steps` is None for a stream without
        `train.max_steps`: no planned end (the cosine schedule is refused before this). With
        a `LambdaLR` (as the default), a changed `train.lr` or weight decay applies from the
        resumed step on.
        """
        return optim.warmup_then(optimizer, self.cfg.train, total_steps)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks of the model, the unit of sharding and activation checkpointing.

        `dist.strategy = "fsdp"` shards each block separately (its parameters are gathered
        only while it runs); `train.activation_checkpointing = "blocks"` recomputes each
        block's activations in the backward pass. Default: the entries of every
        `nn.ModuleList` (the layers of a transformer-style model); none: the whole model is
        one unit.
        """
        return [
            block
            for module in model.modules()
            if isinstance(module, nn.ModuleList)
            for block in module
        ]

    def pretrained_target(self, model: nn.Module) -> nn.Module:
        """The part of the model that `model.init_from`'s weights are loaded into.

        Parameters outside it (adapters, a new head) are initialised by their module's
        `reset_parameters()` (engine/state/initial_weights.py).
        """
        return model

    def pretrained_name(self, name: str) -> str:
        """The name in `model.init_from`'s files of the target's tensor `name`.

        Default: the same. Override it for weights saved under other names, e.g.
        `return name.replace("encoder.", "model.")`.
        """
        return name

    def after_step(self, model: nn.Module, step: int) -> None:  # noqa: B027  (optional)
        """Called once per optimizer step, on every process, after the step (and accumulation).

        `step` counts the steps done, this one included. Update averaged weights here
        (`self.averaged.update(model, step)`); the model is the unwrapped one (its parameters
        are shards under fsdp).
        """

    def on_epoch_start(self, model: nn.Module, epoch: int) -> None:  # noqa: B027  (optional)
        """Called before each epoch (also the epoch a run resumes in): freeze layers, etc.

        Parameters that get no gradient under DDP need `dist.find_unused_parameters = true`.
        """

    def on_mode(self, model: nn.Module, training: bool) -> None:  # noqa: B027  (optional)
        """Called right after the trainer sets the whole model's mode.

        That is `model.train()` before the training batches of each epoch and after each
        validation (`training` True) and `model.eval()` before evaluation (False). Set other
        modes for parts here, e.g. `backbone.eval()` while it is frozen, so its BatchNorm
        running statistics stay as they are.
        """

    # --- loss, metrics, figures -----------------------------------------------------------
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The mean loss of a training batch (a scalar tensor); runs under autocast.

        Every task defines it, except one whose `optimizer` names several optimizers: that
        one defines `named_loss` instead.
        """
        del model, batch
        raise DataError(f"task {self.name}: define loss(model, batch), the batch's mean loss")

    def named_loss(self, name: str, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The mean loss that the optimizer `name` steps on (several named optimizers).

        Called in the order of `optimizer`'s dict, each after the previous optimizer's step:
        the generator's loss sees the discriminator just updated. Gradients that reach other
        optimizers' parameters are cleared before those step.
        """
        del model, batch
        raise DataError(
            f"task {self.name}: optimizer() names {name!r}: define named_loss(name, model, batch)"
        )

    def record(self, name: str, value: torch.Tensor | float) -> None:
        """Log a training scalar of this micro-batch (a per-head loss, a batch accuracy).

        Call it in `loss`. The train rows of metrics.csv (and every tracker) get its mean over
        the micro-batches since the previous row and over the processes, as the loss does,
        also across a resume. `name` must be in `train_scalars`. A tensor stays on the device
        (nothing waits for the GPU) and is detached.
        """
        if name not in self.train_scalars:
            raise DataError(
                f"task {self.name}: record({name!r}): add {name!r} to the task's train_scalars"
            )
        self.__dict__.setdefault("_recorded", []).append((name, value))

    def take_records(self) -> list[tuple[str, torch.Tensor | float]]:
        """What `record` got since the last call (the trainer's, after each `loss`)."""
        return self.__dict__.pop("_recorded", [])  # type: ignore[no-any-return]

    def add_metrics(self, *names: str) -> None:
        """Report `names` too, after the class's `metrics`: a metric an option turns on.

        Call it in `__init__` (after `super().__init__`); `summarize` must return them.
        """
        self.__dict__["metrics"] = (*self.metrics, *names)

    def keep(self, name: str, rows: torch.Tensor) -> None:
        """Keep per-sample outputs of this evaluation batch (one row per sample) for `summarize`.

        Call it in `evaluate`, for metrics that need every output at once (AUROC, average
        precision, retrieval recall): `summarize` then finds `sums[name]`, the rows of every
        batch and process concatenated. Rows kept under several names in the same calls stay
        aligned (scores with their labels); their order is not the split's. Copied to the
        CPU at once, at most `keep_limit_mb` in all: more stops the run with one line.
        """
        self.__dict__.setdefault("_kept", []).append((name, rows.detach()))

    def take_kept(self) -> list[tuple[str, torch.Tensor]]:
        """What `keep` got since the last call (evaluation's, after each `evaluate`)."""
        return self.__dict__.pop("_kept", [])  # type: ignore[no-any-return]

    @abstractmethod
    def evaluate(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Sums over the batch: loss sum, counts, histograms, ...

        They are added over all batches and processes, so a metric comes from sums or counts,
        or from the per-sample outputs the task `keep`s.
        """

    @abstractmethod
    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """The metrics (named in `metrics`) from the added-up sums of a split."""

    def figures(self, sums: dict[str, torch.Tensor], out_dir: Path, split: str) -> list[Path]:
        """Figures of a split from its sums (the training curves are drawn for every task).

        `out_dir` is the run's figure folder, reports/figures/<run>: its name is the run's,
        for a title that names the run.
        """
        del sums, out_dir, split
        return []

    def model_figures(self, model: nn.Module, out_dir: Path) -> list[Path]:
        """Figures the model draws (generated samples, a reconstruction grid).

        Called once, in one process, with the whole model in eval mode (its averaged weights
        when they are used), under `torch.no_grad()` and with the random generators seeded
        from `run.seed` (`model_figures_seeded`), so the same weights draw the same figure:
        at the end of a finished run (not under fsdp, whose model is in shards) and by
        `evaluate`. Default: none.
        """
        del model, out_dir
        return []


def own_collate(task: Task) -> Callable[[list[Any]], Batch] | None:
    """The task's `collate` when it overrides the default, else None (torch's default)."""
    return task.collate if type(task).collate is not Task.collate else None


def set_mode(task: Task, model: nn.Module, training: bool) -> None:
    """`model.train(training)`, then the task's `on_mode` for the parts it sets itself."""
    model.train(training)
    task.on_mode(model, training)


def model_figures_seeded(task: Task, model: nn.Module, out_dir: Path) -> list[Path]:
    """`task.model_figures` in eval mode, without gradients, seeded from `run.seed`.

    The model's mode and the random generators are restored afterwards.
    """
    if type(task).model_figures is Task.model_figures:
        return []
    was_training = model.training
    set_mode(task, model, False)
    try:
        with torch.no_grad(), seeded_batch(task.cfg.run.seed):
            return task.model_figures(model, out_dir)
    finally:
        set_mode(task, model, was_training)


# --- choosing a task --------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def task_class(name: str) -> type[Task]:
    """The class named by `task.name`, from `tasks/<name>.py` or a dotted module path."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"task.name: {name!r} is not a module name (letters, digits, _)")
    package = __package__ or ""
    module_name = name if "." in name else f"{package}.tasks.{name}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        if gone := _removed_imports(module_name):
            raise ConfigError(
                f"task.name: module {module_name} imports what template release 0.3.0 "
                f"removed ({'; '.join(gone)}): import from ..api instead"
            ) from None
        if not isinstance(err, ModuleNotFoundError):
            raise
        if err.name is None or not module_name.startswith(err.name):
            raise  # the task module exists but imports something missing: show that
        raise ConfigError(
            f"task.name: no task {name!r}; tasks here: {', '.join(available()) or 'none'} "
            f"(a task is a module in src/{package}/tasks/)"
        ) from None
    cls = getattr(module, "TASK", None)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task.name: module {module_name} sets no TASK = <a Task subclass>")
    return cls


# The import paths of release 0.2.0 that release 0.3.0 removed, and where each went: a task
# written then fails to import, and is told so here in one line (CHANGELOG.md, 0.3.0).
_REMOVED = {
    "shards": "data.shards",
    "pretrained": "data.pretrained",
    "transformer": "blocks.transformer",
}
# The names of the former module `data.py`, now in `data/processed.py`.
_FORMER_DATA = frozenset({
    "check_same_data", "prepare", "processed_digest", "read_digests", "stage", "swapped_in",
    "verify", "write_digests",
})  # fmt: skip


def _removed_imports(module_name: str) -> list[str]:
    """`line N: ..old is now ..new` for each import of a removed path in a module's source."""
    try:
        spec = importlib.util.find_spec(module_name)
    except ImportError:  # a package on its dotted path is missing
        return []
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    prefix = f"{__package__}."
    gone = []
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        # From tasks/: `from ..shards import ...`, or spelled out: `from <package>.shards ...`.
        if node.level == 2:
            module = node.module
        elif node.level == 0 and node.module.startswith(prefix):
            module = node.module.removeprefix(prefix)
        else:
            continue
        names = [alias.name for alias in node.names if alias.name in _FORMER_DATA]
        if module in _REMOVED:
            gone.append(f"line {node.lineno}: ..{module} is now ..{_REMOVED[module]}")
        elif module == "data" and names:
            moved = f"{', '.join(names)} of ..data, now ..data.processed"
            gone.append(f"line {node.lineno}: {moved}")
    return gone


def available() -> list[str]:
    """Names of the task modules in `tasks/`."""
    folder = Path(__file__).with_name("tasks")
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def option_types(name: str) -> dict[str, type]:
    """The `[task]` settings of a task and their types (from its `Options` dataclass)."""
    return field_types(task_class(name).Options)


def load_config(
    path: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    task_dir: Path | None = None,
) -> Config:
    """`config.load_config` with the `[task]` settings typed by the named task's `Options`."""
    return config.load_config(path, overrides, task_dir, option_types=option_types)


def config_from_dict(data: dict[str, dict[str, Any]]) -> Config:
    """`config.from_dict` (a run's saved configuration) with the task's settings typed."""
    return config.from_dict(data, option_types=option_types)


def load_task(cfg: Config, settings: Settings) -> Task:
    """An instance of the configured task."""
    return task_class(cfg.task.name)(cfg, settings)


# --- random numbers of a batch being loaded -------------------------------------------------
_current: torch.Generator | None = None


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that depends on (seed, epoch, index) only."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@contextmanager
def seeded_batch(seed: int, restore: bool = True) -> Iterator[None]:
    """Seed torch, `random` and numpy for one batch; restore their states afterwards.

    `restore=False` (a DataLoader worker, whose generators serve the data alone) skips the
    saving and restoring, which cost more than the seeding.
    """
    global _current  # noqa: PLW0603  (one generator per process, for sample_generator())
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state()) if restore else None
    # The CPU generator only: torch.manual_seed also queues seeds for every accelerator
    # backend, with a stack trace each time, which costs milliseconds per call.
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    _current = torch.Generator().manual_seed(seed)
    try:
        yield
    finally:
        if saved is not None:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])
        _current = None


def sample_generator() -> torch.Generator:
    """The generator of the batch being loaded (inside a data set's `__getitem__`)."""
    if _current is None:
        raise RuntimeError("sample_generator() is only available while a batch is loaded")
    return _current


# --- checks and helpers for tasks ----------------------------------------------------------
def check_structure(item: Any, where: str, path: str = "") -> None:
    """Raise DataError unless `item` is tensors/numbers in (nested) tuples, lists, dicts."""
    if isinstance(item, torch.Tensor | int | float | bool | np.ndarray | np.number):
        return
    if isinstance(item, Mapping):
        for key, value in item.items():
            check_structure(value, where, f"{path}[{key!r}]")
        return
    if isinstance(item, tuple | list) and item:
        for i, value in enumerate(item):
            check_structure(value, where, f"{path}[{i}]")
        return
    raise DataError(
        f"{where}{path} is {type(item).__module__}.{type(item).__qualname__}: samples must be "
        "tensors or numbers, or tuples, lists and dicts of them"
    )


def class_labels(values: torch.Tensor, num_classes: int, source: str) -> torch.Tensor:
    """Float or integer labels as int64, refusing anything that is not a class index."""
    values = values.double()
    bad = (values != values.round()) | (values < 0) | (values >= num_classes)
    if bad.any():
        first = int(bad.nonzero()[0, 0])
        raise DataError(
            f"{source}: a classification task needs whole-number labels 0..{num_classes - 1}, "
            f"got {values[first].item():g} (sample {first}); continuous targets need a "
            "regression task (see tasks/regression.py)"
        )
    return values.long()


def split_indices(n: int, val: float, test: float, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random partition of range(n) into train/val/test index tensors."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val, n_test = round(n * val), round(n * test)
    return {
        "val": order[:n_val],
        "test": order[n_val : n_val + n_test],
        "train": order[n_val + n_test :],
    }
