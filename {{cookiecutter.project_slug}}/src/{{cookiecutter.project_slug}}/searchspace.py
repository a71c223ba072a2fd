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

from .config import load_config
from .errors import ConfigError
from .names import check_run_name

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]  # one name for either module

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
    return isinstance(value, int | float) and not isinstance(value, bool)


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


def _range_values(start: Any, stop: Any, step: Any, bad: Callable[[str], ConfigError]) -> list:
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
        return Dimension(key, form, values=_range_values(*args, bad))
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


def load_space(path: Path) -> Space:
    """Read and check a search-space file; a problem raises ConfigError naming the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"search space not found: {path} (see configs/sweep.toml)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None
    for key in sorted(set(data) - {"sweep", "fixed", "space", "enqueue"}):
        raise _where(path, key)("unknown table: use [sweep], [fixed], [space] and [[enqueue]]")
    head = data.get("sweep", {})
    known = {"name", "method", "metric", "direction", "concurrency", "trials", "seed", "pruner",
             "prune_after"}
    for key in sorted(set(head) - known):
        raise _where(path, f"sweep.{key}")(f"unknown key; [sweep] has {sorted(known)}")
    name = check_run_name(_field(head, "name", str, "", path), f"{path}: sweep.name")
    method = _field(head, "method", str, "grid", path)
    direction = _field(head, "direction", str, "min", path)
    pruner = _field(head, "pruner", str, "median", path)
    for key, value, allowed in (
        ("method", method, METHODS),
        ("direction", direction, ("min", "max")),
        ("pruner", pruner, PRUNERS),
    ):
        if value not in allowed:
            raise _where(path, f"sweep.{key}")(f"must be one of {list(allowed)}, got {value!r}")
    counts = {}
    for key, default in (("concurrency", 2), ("trials", 8), ("seed", 0), ("prune_after", 5)):
        counts[key] = _field(head, key, int, default, path)
        if counts[key] < (0 if key in {"seed", "prune_after"} else 1):
            rule = ">= 0" if key in {"seed", "prune_after"} else ">= 1"
            raise _where(path, f"sweep.{key}")(f"must be {rule}, got {counts[key]}")
    fixed = _settings(data.get("fixed", {}), "fixed", path)
    space = _settings(data.get("space", {}), "space", path)
    if not space:
        raise _where(path, "space")("empty: give at least one setting to vary")
    dimensions = [_dimension(key, spec, method, path) for key, spec in space.items()]
    trials = counts["trials"]
    if method == "grid":
        trials = math.prod(len(d.values) for d in dimensions)
        if trials > 10_000:
            raise _where(path, "space")(f"the grid has {trials:,} points: at most 10,000")
    enqueue = data.get("enqueue", [])
    if enqueue and method != "optuna":
        raise _where(path, "enqueue")("only for method = optuna (points to try first)")
    if not isinstance(enqueue, list):
        raise _where(path, "enqueue")("write [[enqueue]] tables")
    firsts = [_settings(point, f"enqueue[{i}]", path) for i, point in enumerate(enqueue)]
    for i, point in enumerate(firsts):
        if set(point) != set(space):
            raise _where(path, f"enqueue[{i}]")(f"give exactly the keys of [space]: {sorted(space)}")
    return Space(
        path=path,
        name=name,
        method=method,
        metric=_field(head, "metric", str, "loss", path),
        direction=direction,
        concurrency=counts["concurrency"],
        trials=trials,
        seed=counts["seed"],
        pruner=pruner,
        prune_after=counts["prune_after"],
        fixed=[f"{key}={to_text(f'fixed.{key}', v, path)}" for key, v in fixed.items()],
        dimensions=dimensions,
        enqueue=firsts,
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
    rng = random.Random(space.seed)
    return [{d.key: _draw(d, rng) for d in space.dimensions} for _ in range(space.trials)]


def overrides(space: Space, point: dict[str, Scalar], run: str, extra: list[str]) -> list[str]:
    """A run's `key=value` list: fixed settings, the command line's, the point's, its name."""
    varied = [f"{key}={to_text(f'space.{key}', v, space.path)}" for key, v in point.items()]
    return [*space.fixed, *extra, *varied, f"run.name={run}"]


def check_runs(settings: list[list[str]], config: Path | None, task_dir: Path) -> None:
    """Load every run's configuration as `train` would: a bad key or value stops the sweep."""
    for items in settings:
        try:
            load_config(config, items, task_dir=task_dir)
        except ConfigError as err:
            run = items[-1].removeprefix("run.name=")
            raise ConfigError(f"sweep run {run}: {err}") from None
