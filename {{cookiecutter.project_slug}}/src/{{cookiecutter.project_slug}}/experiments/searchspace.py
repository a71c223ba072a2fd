"""The search space of a sweep (configs/sweep.toml): read, checked, expanded into runs.

A grid is the product of its dimensions (lists and ranges); a random sweep draws `trials`
points with a seeded generator; an Optuna sweep uses the same dimensions as distributions
(sweep.py). Every point is an ordinary run named `<sweep name>-<index>`, with its settings as
`section.key=value` overrides, so it resumes and requeues like any other run.
"""

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config, read_toml
from ..engine.names import check_run_name
from ..errors import ConfigError

METHODS = ("grid", "random", "optuna")
PRUNERS = ("median", "none")
# The forms of a dimension: a TOML list is a list of values (a choice), a one-key table one
# of these. `range` is a grid's arithmetic sequence, the others are distributions to draw from.
FORMS = ("range", "uniform", "log_uniform", "int")
Scalar = bool | int | float | str


@dataclass
class Dimension:
    """One setting the sweep varies: its values (`values`) or a distribution `form`."""

    key: str  # section.key
    form: str  # "list" or one of FORMS
    values: list[Scalar] = field(default_factory=list)  # list and range: the values
    low: float = 0.0  # uniform, log_uniform, int: the bounds (both included)
    high: float = 0.0


@dataclass
class Space:
    """A parsed configs/sweep.toml."""

    path: Path
    name: str
    method: str
    metric: str
    direction: str  # min | max
    concurrency: int
    trials: int  # random and optuna: points; grid: the product's size
    seed: int
    pruner: str
    prune_after: int
    fixed: list[str]  # section.key=value of every point
    dimensions: list[Dimension]
    enqueue: list[dict[str, Scalar]]  # optuna: points tried first


def _where(path: Path, key: str) -> Callable[[str], ConfigError]:
    return lambda rule: ConfigError(f"{path}: {key}: {rule}")


def _number(value: Any) -> bool:
    """A finite int or float (TOML's inf and nan, and 1e400, which reads as inf, are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def to_text(key: str, value: Any, path: Path) -> str:
    """A TOML value as the text of a `key=value` override (one word: no white space)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        raise _where(path, key)(f"must be a finite number, got {value!r}")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value  # a run's line is split at white space (slurm/sweep.sbatch)
    raise _where(path, key)(f"must be a number, true/false or a word without spaces, got {value!r}")


def _settings(table: Any, where: str, path: Path) -> dict[str, Any]:
    """`section.key = value` pairs of a table (TOML dotted keys nest one level)."""
    if not isinstance(table, dict):
        raise _where(path, where)("must be a table of section.key = value")
    flat = {}
    for section, keys in table.items():
        if not isinstance(keys, dict):
            raise _where(path, f"{where}.{section}")("write section.key, e.g. train.lr")
        for key, value in keys.items():
            flat[f"{section}.{key}"] = value
    return flat


def _range_values(
    start: Any, stop: Any, step: Any, bad: Callable[[str], ConfigError]
) -> list[Scalar]:
    if not (_number(start) and _number(stop) and _number(step)) or step <= 0 or stop < start:
        shape = "range = [start, stop, step] needs numbers, step > 0, stop >= start"
        raise bad(f"{shape}, got {[start, stop, step]}")
    count = math.floor((stop - start) / step + 1e-9) + 1  # stop included when it is on the grid
    if count > 10_000:
        raise bad(f"the range has {count} values: at most 10,000")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return [start + i * step for i in range(count)]
    return [round(start + i * step, 12) for i in range(count)]  # 0.1 + 2 * 0.1 -> 0.3


def _dimension(key: str, spec: Any, method: str, path: Path) -> Dimension:
    bad = _where(path, f"space.{key}")
    if isinstance(spec, list):
        if not spec:
            raise bad("an empty list: give at least one value")
        for value in spec:
            to_text(f"space.{key}", value, path)
        return Dimension(key, "list", values=list(spec))
    if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in FORMS):
        forms = " | ".join(f"{form} = [...]" for form in FORMS)
        raise bad(f"must be a list of values or a table, one of: {forms}")
    ((form, args),) = spec.items()
    if not isinstance(args, list) or len(args) != (3 if form == "range" else 2):
        raise bad(f"{form} takes [{'start, stop, step' if form == 'range' else 'low, high'}]")
    if form == "range":
        start, stop, step = args
        return Dimension(key, form, values=_range_values(start, stop, step, bad))
    if method == "grid":
        raise bad(f"{form} is a distribution: a grid takes lists and ranges (or method = random)")
    low, high = args
    if not (_number(low) and _number(high) and low < high):
        raise bad(f"{form} = [low, high] needs numbers with low < high, got {args}")
    if form == "log_uniform" and low <= 0:
        raise bad(f"log_uniform needs low > 0, got {low}")
    if form == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise bad(f"int = [low, high] needs whole numbers, got {args}")
    return Dimension(key, form, low=low, high=high)


def _field(table: dict[str, Any], key: str, kind: type, default: Any, path: Path) -> Any:
    value = table.get(key, default)
    if type(value) is not kind and not (kind is float and isinstance(value, int)):
        raise _where(path, f"sweep.{key}")(f"expected {kind.__name__}, got {value!r}")
    return value


# The keys of [sweep] with their defaults; the strings among them with their allowed values.
HEAD: dict[str, Any] = {
    "name": "",
    "method": "grid",
    "metric": "loss",
    "direction": "min",
    "concurrency": 2,
    "trials": 8,
    "seed": 0,
    "pruner": "median",
    "prune_after": 5,
}
HEAD_CHOICES = {"method": METHODS, "direction": ("min", "max"), "pruner": PRUNERS}


def _head(table: Any, path: Path) -> dict[str, Any]:
    """The [sweep] table, checked, with defaults for the keys not given."""
    if not isinstance(table, dict):
        raise _where(path, "sweep")("must be a [sweep] table")
    for key in sorted(set(table) - set(HEAD)):
        raise _where(path, f"sweep.{key}")(f"unknown key; [sweep] has {sorted(HEAD)}")
    head = {key: _field(table, key, type(default), default, path) for key, default in HEAD.items()}
    check_run_name(head["name"], f"{path}: sweep.name")
    for key, allowed in HEAD_CHOICES.items():
        if head[key] not in allowed:
            raise _where(path, f"sweep.{key}")(f"must be one of {list(allowed)}, got {head[key]!r}")
    for key in ("concurrency", "trials"):
        if head[key] < 1:
            raise _where(path, f"sweep.{key}")(f"must be >= 1, got {head[key]}")
    for key in ("seed", "prune_after"):
        if head[key] < 0:
            raise _where(path, f"sweep.{key}")(f"must be >= 0, got {head[key]}")
    return head


def _enqueued(
    data: dict[str, Any], method: str, keys: set[str], path: Path
) -> list[dict[str, Any]]:
    """The [[enqueue]] points (optuna), each with exactly the keys of [space]."""
    enqueue = data.get("enqueue", [])
    if enqueue and method != "optuna":
        raise _where(path, "enqueue")("only for method = optuna (points to try first)")
    if not isinstance(enqueue, list):
        raise _where(path, "enqueue")("write [[enqueue]] tables")
    firsts = [_settings(point, f"enqueue[{i}]", path) for i, point in enumerate(enqueue)]
    for i, point in enumerate(firsts):
        if set(point) != keys:
            raise _where(path, f"enqueue[{i}]")(f"give exactly the keys of [space]: {sorted(keys)}")
    return firsts


def load_space(path: Path) -> Space:
    """Read and check a search-space file; a problem raises ConfigError naming the key."""
    data = read_toml(path, f"search space not found: {path} (see configs/sweep.toml)")
    for key in sorted(set(data) - {"sweep", "fixed", "space", "enqueue"}):
        raise _where(path, key)("unknown table: use [sweep], [fixed], [space] and [[enqueue]]")
    head = _head(data.get("sweep", {}), path)
    fixed = _settings(data.get("fixed", {}), "fixed", path)
    space = _settings(data.get("space", {}), "space", path)
    if not space:
        raise _where(path, "space")("empty: give at least one setting to vary")
    dimensions = [_dimension(key, spec, head["method"], path) for key, spec in space.items()]
    if head["method"] == "grid":
        head["trials"] = math.prod(len(d.values) for d in dimensions)
        if head["trials"] > 10_000:
            raise _where(path, "space")(f"the grid has {head['trials']:,} points: at most 10,000")
    return Space(
        path=path,
        **head,
        fixed=[f"{key}={to_text(f'fixed.{key}', v, path)}" for key, v in fixed.items()],
        dimensions=dimensions,
        enqueue=_enqueued(data, head["method"], set(space), path),
    )


def run_name(sweep: str, index: int, count: int) -> str:
    """`<sweep>-000`, `<sweep>-001`, ...: zero-padded to `count`, so they sort and glob in order."""
    return f"{sweep}-{index:0{max(3, len(str(count - 1)))}d}"


def _draw(dim: Dimension, rng: random.Random) -> Scalar:
    if dim.form in {"list", "range"}:
        return rng.choice(dim.values)
    if dim.form == "int":
        return rng.randint(int(dim.low), int(dim.high))
    if dim.form == "log_uniform":
        value = math.exp(rng.uniform(math.log(dim.low), math.log(dim.high)))
    else:
        value = rng.uniform(dim.low, dim.high)
    return float(f"{value:.6g}")  # readable in names and tables; far finer than any effect


def points(space: Space) -> list[dict[str, Scalar]]:
    """The settings of every point: the grid's product, or `trials` seeded draws."""
    if space.method == "grid":
        keys = [d.key for d in space.dimensions]
        product = itertools.product(*(d.values for d in space.dimensions))
        return [dict(zip(keys, combo, strict=True)) for combo in product]
    rng = random.Random(space.seed)  # noqa: S311  (sampling settings, not secrets)
    return [{d.key: _draw(d, rng) for d in space.dimensions} for _ in range(space.trials)]


def overrides(space: Space, point: dict[str, Scalar], run: str, extra: list[str]) -> list[str]:
    """A run's `key=value` list: fixed settings, the command line's, the point's, its name."""
    varied = [f"{key}={to_text(f'space.{key}', v, space.path)}" for key, v in point.items()]
    return [*space.fixed, *extra, *varied, f"run.name={run}"]


def _run_config(items: list[str], config: Path | None, task_dir: Path) -> Config:
    """One run's configuration, as `train` would load it; an error names the run."""
    from ..task import load_config  # noqa: PLC0415  (imports torch)

    try:
        return load_config(config, items, task_dir=task_dir)
    except ConfigError as err:
        run = items[-1].removeprefix("run.name=")
        raise ConfigError(f"sweep run {run}: {err}") from None


def check_runs(
    space: Space, settings: list[list[str]], config: Path | None, task_dir: Path
) -> None:
    """Load every run's configuration as `train` would: a bad key or value stops the sweep.

    The sweep's metric must be one the task computes on the validation split.
    """
    from ..settings import get_settings  # noqa: PLC0415
    from ..task import load_task  # noqa: PLC0415  (imports torch)

    for items in settings:
        cfg = _run_config(items, config, task_dir)
        metrics = load_task(cfg, get_settings()).metrics  # with those its options turn on
        if space.metric not in metrics:
            raise _where(space.path, "sweep.metric")(
                f"{space.metric!r} is not a metric of task {cfg.task.name} (one of {list(metrics)})"
            )
