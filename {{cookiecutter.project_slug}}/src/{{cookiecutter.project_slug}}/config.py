"""Typed configuration: dataclasses, TOML files and `section.key=value` overrides.

The dataclasses below are the single source of every setting and its default; the TOML files in
`configs/` only override them, in this order: `configs/train.toml` (settings of the project
and its cluster), then `configs/tasks/<task.name>.toml` (the task's own settings and
hyperparameters), then `section.key=value` overrides on the command line. Values are
type-checked on load, so a typo or a wrong type stops the program with one line that names the
key, before any data is touched. The `[task]` section's keys other than `name` are the fields
of the task's `Options` dataclass: their types come in as `option_types` (a function of the
task's name, `task.option_types`), so this module never imports the task seam or torch.
`task.load_config` is the call that passes them.
"""

import dataclasses
import json
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]  # one name for either module

from .errors import ConfigError


@dataclass
class RunConfig:
    """Naming, seeding, logging and checkpointing of a run."""

    name: str = ""  # empty: RUN_NAME, then the Slurm (array) job id, then a timestamp
    seed: int = 0
    deterministic: bool = False  # bit-reproducible kernels; slower on GPUs
    tracking: str = "csv"  # csv | tensorboard | wandb | mlflow (metrics.csv is always written)
    progress: str = "auto"  # auto (bar on a terminal, log lines otherwise) | bar | log
    log_every_steps: int = 50
    checkpoint_every_steps: int = 0  # 0: only at epoch ends (and on stop signals)
    checkpoint_every_minutes: float = 30.0  # bounds the work lost to a hard kill; 0: off
    keep_checkpoints: int = 3
    # Periodic checkpoints written in the background from a staged copy (training goes on);
    # the one on a stop signal and the last one are always written before the exit.
    async_checkpoint: bool = False
    max_steps_this_segment: int = 0  # >0: checkpoint and exit 0 after this many steps
    val_every_steps: int = 0  # >0: also validate every this many steps (always at epoch ends)
    best_metric: str = ""  # a validation metric of the task: keep its best weights in best.pt
    best_mode: str = "min"  # min | max: which values of best_metric are better
    figures: bool = True
    profile_steps: int = 0  # >0: a torch profiler trace of this many steps in the run folder
    debug: bool = False  # NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, OOM allocation history


# Settings of one segment (one start of `train`), not of the run: each start takes its own
# and the run trains the same whatever they were, so a resume names no change of them.
PER_SEGMENT = frozenset(
    {"run.max_steps_this_segment", "run.profile_steps", "run.progress", "run.debug"}
)


@dataclass
class DataConfig:
    """Where the data comes from and how batches are fed to the model."""

    verify_raw: bool = True  # check data/raw against its manifest before reading it
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 0
    in_memory: str = "auto"  # auto | yes | no: batches sliced from device tensors
    in_memory_max_gb: float = 4.0  # "auto" uses the fast path up to this size
    num_workers: int = -1  # DataLoader workers per process; -1: from the CPU allocation
    prefetch_factor: int = 2
    stage_to_node_tmp: bool = True  # inside a job, copy processed data to node-local disk
    node_tmp_var: str = "LOCAL_TMPDIR"  # environment variable naming that disk


@dataclass
class ModelConfig:
    """Model architecture and how it is compiled."""

    name: str = "mlp"  # an architecture the task knows (models.py has mlp and cnn)
    hidden: int = 256  # MLP width
    depth: int = 2  # MLP hidden layers
    channels: int = 32  # CNN width
    dropout: float = 0.1
    compile: bool = False  # torch.compile: faster steps after a slow first one
    channels_last: bool = False  # faster convolutions on tensor-core GPUs
    # initial weights (fresh runs only): a local state-dict or .safetensors file, or a model
    # folder with model.safetensors.index.json and its shards (see pretrained.py)
    init_from: str = ""


@dataclass
class TrainConfig:
    """Optimisation."""

    epochs: int = 30
    # > 0: the run ends at this optimizer step (or after `epochs`, if sooner). A stream has no
    # length, so its runs have no planned end without it, and the cosine schedule needs one.
    max_steps: int = 0
    batch_size: int = 128  # per process; the global batch is this x processes x accumulation
    lr: float = 3e-3
    weight_decay: float = 0.01
    schedule: str = "cosine"  # cosine | constant (both after linear warmup)
    warmup_steps: int = 20
    grad_accum_steps: int = 1
    grad_clip: float = 1.0  # max gradient norm; 0: off
    nonfinite_patience: int = 0  # logging windows in a row with a NaN/inf loss before stopping
    precision: str = "auto"  # auto (bf16 where supported, else fp32) | bf16 | fp16 | fp32
    device: str = "auto"  # auto (cuda, mps, cpu) | cuda | mps | cpu
    # blocks: recompute each block's activations in the backward pass (less memory, ~30% slower)
    activation_checkpointing: str = "none"  # none | blocks


@dataclass
class DistConfig:
    """Multi-process training: how the model is spread over the processes."""

    # ddp: every process holds the whole model (small models); fsdp: parameters, gradients
    # and optimizer state sharded over the processes (models too big for one GPU's memory)
    strategy: str = "ddp"  # ddp | fsdp

    backend: str = "auto"  # auto (nccl on CUDA, gloo otherwise) | nccl | gloo
    timeout_minutes: float = 10.0  # a rank stuck this long aborts instead of hanging
    # true when some parameters get no gradient in a step (frozen layers, unused branches);
    # costs a graph traversal per step, so it is off unless a task needs it.
    find_unused_parameters: bool = False


@dataclass
class TaskConfig:
    """Which task (tasks/<name>.py) and its own settings (its Options dataclass)."""

    name: str = "digits"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    """The whole configuration of a command."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    task: TaskConfig = field(default_factory=TaskConfig)


# Allowed values of the string settings that are choices.
CHOICES: dict[str, tuple[str, ...]] = {
    "run.tracking": ("csv", "tensorboard", "wandb", "mlflow"),
    "run.progress": ("auto", "bar", "log"),
    "run.best_mode": ("min", "max"),
    "data.in_memory": ("auto", "yes", "no"),
    "train.schedule": ("cosine", "constant"),
    "train.precision": ("auto", "bf16", "fp16", "fp32"),
    "train.device": ("auto", "cuda", "mps", "cpu"),
    "dist.backend": ("auto", "nccl", "gloo"),
    "dist.strategy": ("ddp", "fsdp"),
    "train.activation_checkpointing": ("none", "blocks"),
}
# Numeric settings that must be positive (> 0); all other numbers must be >= 0,
# except data.num_workers where -1 means "automatic".
POSITIVE = {
    "run.log_every_steps",
    "run.keep_checkpoints",
    "train.epochs",
    "train.batch_size",
    "train.lr",
    "train.grad_accum_steps",
    "data.prefetch_factor",
    "dist.timeout_minutes",
}


# --- Upper bounds: values beyond these are typos, not experiments -------------------------
# A 20-digit seed overflows torch's generator; 10^11 hidden units or 10^20 epochs run out of
# memory or run forever without saying why. Settings missing here have no upper bound.
# Seeds stay below 2**31 so that seed + rank fits every generator. (data.num_workers has
# none: `doctor` warns when it exceeds the CPUs of the job.)
UPPER_BOUNDS: dict[str, float] = {
    "run.seed": 2**31 - 1,
    "data.split_seed": 2**31 - 1,
    "run.log_every_steps": 10**9,
    "run.checkpoint_every_steps": 10**9,
    "run.checkpoint_every_minutes": 7 * 24 * 60,
    "run.keep_checkpoints": 10_000,
    "run.max_steps_this_segment": 10**12,
    "run.profile_steps": 10_000,
    "data.in_memory_max_gb": 10**6,
    "data.prefetch_factor": 1024,
    "model.hidden": 10**6,
    "model.depth": 10_000,
    "model.channels": 10**5,
    "model.dropout": 1,
    "train.epochs": 10**6,
    "train.max_steps": 10**12,
    "train.batch_size": 10**8,
    "train.warmup_steps": 10**9,
    "train.grad_accum_steps": 10**5,
    "dist.timeout_minutes": 7 * 24 * 60,
}


def check_upper_bounds(cfg: Config) -> None:
    """Raise ConfigError for the first setting above its upper bound."""
    sections = _sections(cfg)
    for key, bound in UPPER_BOUNDS.items():
        section, name = key.split(".")
        value = getattr(sections[section], name)
        if value > bound:
            raise ConfigError(f"{key}: must be at most {bound:,}, got {value!r}")


def field_types(cls: type) -> dict[str, type]:
    """The declared type of each field of a dataclass (resolved, never a string)."""
    return typing.get_type_hints(cls)


def _sections(cfg: Config) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _coerce(key: str, value: Any, kind: type, from_text: bool) -> Any:
    """Return `value` as `kind` or raise ConfigError; `from_text`: parse command-line text."""
    if from_text and kind is not str:
        text = value.strip().lower()
        if kind is bool:
            if text in {"true", "yes", "1", "on"}:
                return True
            if text in {"false", "no", "0", "off"}:
                return False
        else:
            try:
                return kind(text)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not kind:
        raise ConfigError(f"{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _in_file(err: ConfigError, source: Path | None) -> ConfigError:
    """``err`` with the file its setting came from in front (unchanged for an override)."""
    return err if source is None else ConfigError(f"{source}: {err}")


def _set(
    cfg: Config, dotted: str, value: Any, from_text: bool = False, source: Path | None = None
) -> None:
    """Set one setting; `[task]` settings wait, with their file, until the task is known."""
    section_name, _, key = dotted.partition(".")
    sections = _sections(cfg)
    if section_name not in sections or not key:
        raise ConfigError(
            f"unknown config key {dotted!r}: use section.key with a section in {sorted(sections)}"
        )
    if dotted == "data.dataset":  # projects made before template release 0.2.0
        raise ConfigError(
            f"data.dataset = {value!r}: replaced by the task seam; write [task] name = "
            '"digits" (or your task) in configs/train.toml, see docs/bring-your-own-task.md'
        )
    if section_name == "task" and key != "name":
        cfg.task.options[key] = (value, from_text, source)  # typed once the task is known
        return
    section = sections[section_name]
    kinds = field_types(type(section))
    if key not in kinds:
        raise ConfigError(f"unknown config key {dotted!r}; [{section_name}] has {sorted(kinds)}")
    setattr(section, key, _coerce(dotted, value, kinds[key], from_text))


# The `[task]` settings' types from the task's name (task.option_types: imports the task).
OptionTypes = Callable[[str], dict[str, type]]


def _type_task_options(
    cfg: Config, option_types: OptionTypes, name_source: Path | None = None
) -> None:
    """Coerce the `[task]` settings with the types of the task's Options dataclass.

    They are checked only here, once every layer is read, so each error names the file the
    setting came from (`name_source`: the file that set `task.name`), as other tables' do.
    """
    try:
        kinds = option_types(cfg.task.name)
    except ConfigError as err:
        raise _in_file(err, name_source) from None
    typed = {}
    for key, (value, from_text, source) in cfg.task.options.items():
        if key not in kinds:
            unknown = ConfigError(
                f"unknown config key 'task.{key}'; task {cfg.task.name!r} has "
                f"{sorted(kinds) or 'no settings'}"
            )
            raise _in_file(unknown, source)
        try:
            typed[key] = _coerce(f"task.{key}", value, kinds[key], from_text)
        except ConfigError as err:
            raise _in_file(err, source) from None
    cfg.task.options = typed


def validate(cfg: Config) -> None:
    """Check choices and ranges; raise ConfigError naming the first bad setting."""
    for section_name, section in _sections(cfg).items():
        for f in dataclasses.fields(section):
            key, value = f"{section_name}.{f.name}", getattr(section, f.name)
            if f.type not in {int, float, bool, str}:
                continue  # task.options: checked by the task
            if key in CHOICES and value not in CHOICES[key]:
                raise ConfigError(f"{key}: must be one of {list(CHOICES[key])}, got {value!r}")
            if f.type in {int, float}:
                if isinstance(value, float) and not math.isfinite(value):
                    raise ConfigError(f"{key}: must be a finite number, got {value!r}")
                lowest = -1 if key == "data.num_workers" else 0
                if key in POSITIVE and value <= 0:
                    raise ConfigError(f"{key}: must be > 0, got {value!r}")
                if value < lowest:
                    raise ConfigError(f"{key}: must be >= {lowest}, got {value!r}")
    if cfg.data.val_fraction + cfg.data.test_fraction >= 1:
        raise ConfigError("data.val_fraction + data.test_fraction: must be < 1")
    check_upper_bounds(cfg)


def read_toml(path: Path, missing: str) -> dict[str, Any]:
    """A TOML file's content; a missing or invalid file raises ConfigError (`missing` names it)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        reason = "not UTF-8 text" if isinstance(err, UnicodeDecodeError) else err.strerror
        raise ConfigError(f"{path}: cannot be read: {reason}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    data = read_toml(path, f"config file not found: {path}")
    for section_name, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section_name!r} must be a [section]")
    return data


def _apply(cfg: Config, data: dict[str, Any], source: Path | None = None) -> None:
    """Set every value of ``data``; an error names ``source``, the file they come from."""
    try:
        for section_name, table in data.items():
            for key, value in table.items():
                _set(cfg, f"{section_name}.{key}", value, source=source)
    except ConfigError as err:
        raise _in_file(err, source) from None


def _apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> None:
    for item in overrides:
        dotted, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        _set(cfg, dotted.strip(), value, from_text=True)


def load_config(
    path: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    task_dir: Path | None = None,
    *,
    option_types: OptionTypes,
) -> Config:
    """Defaults, the TOML file (if given), `task_dir/<task.name>.toml` (if there), overrides."""
    layers = [(path, _read_toml(path))] if path is not None else []
    if task_dir is not None:  # the task's name may come from any layer, the overrides last
        probe = Config()
        for source, data in layers:
            _apply(probe, data, source)
        _apply_overrides(probe, overrides)
        task_file = task_dir / f"{probe.task.name}.toml"
        if task_file.is_file():
            layers.append((task_file, _read_toml(task_file)))
    cfg = Config()
    name_source = None  # the file that names the task, for an error about the name
    for source, data in layers:
        _apply(cfg, data, source)
        if "name" in data.get("task", {}):
            name_source = source
    _apply_overrides(cfg, overrides)
    if any(item.partition("=")[0].strip() == "task.name" for item in overrides):
        name_source = None
    _type_task_options(cfg, option_types, name_source)
    validate(cfg)
    return cfg


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """Nested plain dict of the configuration; the task's settings sit beside its name."""
    data = dataclasses.asdict(cfg)
    task = data.pop("task")
    data["task"] = {"name": task["name"], **task["options"]}
    return data


def from_dict(data: dict[str, dict[str, Any]], *, option_types: OptionTypes) -> Config:
    """Inverse of `to_dict` (used when reading a run's saved configuration)."""
    cfg = Config()
    _apply(cfg, data)
    _type_task_options(cfg, option_types)
    validate(cfg)
    return cfg


def to_toml(cfg: Config) -> str:
    """Render the resolved configuration as TOML (str, int, float and bool values only)."""
    lines: list[str] = []
    for section_name, table in to_dict(cfg).items():
        lines.append(f"[{section_name}]")
        for key, value in table.items():
            if isinstance(value, str):
                text = json.dumps(value)  # JSON escapes are valid TOML basic-string escapes
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = repr(value)
            lines.append(f"{key} = {text}")
        lines.append("")
    return "\n".join(lines)
