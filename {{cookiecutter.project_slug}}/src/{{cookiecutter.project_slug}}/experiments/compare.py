"""`compare`: one table of runs, made only from the files each run writes.

Per run: the settings that differ between the chosen runs (`config.toml`, the latest start's),
the final and the best validation value of each of the task's metrics with the step of the
best (`metrics.csv`), steps, segments (`provenance.jsonl` has one line per start), wall and
GPU hours over all segments (`summary.json`'s `whole_run`) and a status:

- finished: trained to the last step;
- stopped: checkpointed after a stop signal or at a segment's end; it continues where it
  stopped when it is started again (the requeue, the next job of a chain, a resubmission);
- diverged: stopped by a NaN/inf loss;
- data-failed: stopped because its data failed to read (a damaged file); its last good step
  is checkpointed, and it continues from there once the file is repaired;
- running: a process holds the run directory's lock now;
- failed: no report, and nothing holds the lock (killed or crashed before its first report).

Rows are sorted by the main metric's best value: `--metric`, else the runs' `run.best_metric`,
else `loss`. The terminal gets a table that fits WIDTH columns (`short_table`); `--wide`
prints every column, as reports/NAME.csv and .md always hold them. No torch here: on a login
node the table takes a second.
"""

import contextlib
import csv
import errno
import fcntl
import fnmatch
import json
import math
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]  # one name for either module

# Columns of metrics.csv that are not the task's metrics (lr_<group> columns neither).
NOT_METRICS = {"step", "epoch", "phase", "grad_norm", "samples_per_s", "elapsed_s"}
# Metric names (or a word of them, split at "_") for which higher is better; every other
# metric is taken as lower-is-better (loss, rmse, perplexity, error, ...). A run's
# run.best_metric with its run.best_mode, or --mode, overrides this for the main metric.
HIGHER_IS_BETTER = {"accuracy", "acc", "r2", "f1", "precision", "recall", "auc", "auroc", "iou"}
HIGHER_IS_BETTER |= {"dice", "bleu", "map", "top1", "top5"}
# Settings that differ between any two runs and say nothing about them.
IGNORED = {"run.name"}
# How many of the best runs the figure draws in colour, with their names and best values.
HIGHLIGHT = 3
# The terminal's table fits this many columns (a terminal, a side-by-side editor pane); the
# reports keep every column, and so does `--wide`.
WIDTH = 100
# In the terminal's table, a setting's name or value longer than this is cut, with an ellipsis:
# a name keeps its end (the key), a value its start.
CELL = 16


@dataclass
class Run:
    """What one run directory says about the run."""

    name: str
    status: str
    settings: dict[str, str]
    curves: dict[str, list[tuple[int, float]]]  # validation (step, value) per metric
    step: int | None = None
    total_steps: int | None = None
    segments: int = 0
    wall_h: float | None = None
    gpu_h: float | None = None
    best_metric: tuple[str, str] = ("", "")  # the run's run.best_metric and run.best_mode
    final: dict[str, float] = field(default_factory=dict)
    best: dict[str, tuple[float, int]] = field(default_factory=dict)  # value and its step
    problem: str = ""  # status "damaged": the file that cannot be read, and why


class DamagedRunError(ValueError):
    """A file of a run holds what no run writes (edited, or damaged on disk)."""


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[Path]:
    """Within: reading the run's file `path`; DamagedRunError naming it if it cannot be read.

    A file not written yet is the reader's to handle; content that is not what the trainer
    writes (not UTF-8, not TOML or JSON, a step that is no number, a string for a number)
    becomes one line, so that one damaged run does not take the whole table with it.
    """
    try:
        yield path
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # decoding errors too
        reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise DamagedRunError(f"{path}: {reason.splitlines()[0]}") from None


def select(runs_dir: Path, patterns: Sequence[str]) -> list[Path]:
    """Run directories below `runs_dir` whose names match any of `patterns` (all by default)."""
    found = (
        sorted(
            p
            for p in runs_dir.iterdir()
            if p.is_dir() and ((p / "config.toml").is_file() or (p / "metrics.csv").is_file())
        )
        if runs_dir.is_dir()
        else []
    )
    if not found:
        raise DataError(f"compare: no runs in {runs_dir}: train first")
    if not patterns:
        return found
    chosen = []
    for pattern in patterns:
        matched = [p for p in found if fnmatch.fnmatchcase(p.name, pattern)]
        if not matched:
            names = ", ".join(p.name for p in found[:10]) + (", ..." if len(found) > 10 else "")
            raise DataError(f"RUNS: no run matches {pattern!r} in {runs_dir}; runs: {names}")
        chosen += [p for p in matched if p not in chosen]
    return chosen


def locked(run_dir: Path) -> bool:
    """Whether a training process holds `run_dir/.lock` (checkpoint.lock_run_dir) now.

    Asked by taking a shared lock without waiting and dropping it at once: it is refused
    exactly while a process holds the exclusive one, on any node (POSIX locks over NFS too).
    """
    try:
        fd = os.open(run_dir / ".lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        return err.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        os.close(fd)  # also drops the shared lock
    return False


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested TOML table as `section.key` -> the value as TOML would write it."""
    flat: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = json.dumps(value) if isinstance(value, (str, list)) else str(value)
            flat[name] = flat[name].lower() if isinstance(value, bool) else flat[name]
    return flat


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or cut off by a kill
        return None
    return data if isinstance(data, dict) else None


def _config(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _metrics(path: Path) -> tuple[list[dict[str, str]], dict[str, list[tuple[int, float]]]]:
    """Rows of metrics.csv and the validation curves (step, value) of each metric."""
    if not path.is_file():
        return [], {}
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if None not in r.values()]  # a row cut off by a kill: no
        columns = list(reader.fieldnames or [])
    val = [r for r in rows if r["phase"] == "val"]
    metrics = [c for c in columns if c not in NOT_METRICS and not c.startswith("lr")]
    curves = {
        m: [(int(r["step"]), v) for r in val if (v := _number(r[m])) is not None] for m in metrics
    }
    for row in rows:
        int(row["step"])  # every row's step: _add_progress reads the last one
    return rows, {m: points for m, points in curves.items() if points}


def _segments(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def read_run(run_dir: Path) -> Run:
    """One run from its config.toml, metrics.csv, summary.json and provenance.jsonl.

    A run with a damaged file is status "damaged", its `problem` naming the file.
    """
    try:
        with _reading(run_dir / "config.toml") as path:
            config = _config(path)
            run_table = config.get("run", {})
            best_metric = (
                str(run_table.get("best_metric", "")),
                str(run_table.get("best_mode", "")),
            )
        with _reading(run_dir / "metrics.csv") as path:
            rows, curves = _metrics(path)
        with _reading(run_dir / "provenance.jsonl") as path:
            segments = _segments(path)
        with _reading(run_dir / "summary.json") as path:
            summary = _read_json(path)
            run = Run(
                name=run_dir.name,
                status=_status(run_dir, summary),
                settings=flatten(config),
                curves=curves,
                segments=segments,
                best_metric=best_metric,
            )
            _add_progress(run, summary, rows)
    except DamagedRunError as err:
        return Run(name=run_dir.name, status="damaged", settings={}, curves={}, problem=str(err))
    return run


def _status(run_dir: Path, summary: dict[str, Any] | None) -> str:
    if locked(run_dir):
        return "running"
    if summary is None:
        return "failed"
    status = str(summary.get("status", "failed"))
    return "stopped" if status == "segment" else status


def _add_progress(run: Run, summary: dict[str, Any] | None, rows: list[dict[str, str]]) -> None:
    """Steps, wall and GPU hours: the last report's, brought up to the newest metrics row."""
    whole = (summary or {}).get("whole_run", {})
    wall_s, gpu_s = whole.get("wall_s"), whole.get("gpu_s")
    run.step = (summary or {}).get("step")
    run.total_steps = (summary or {}).get("total_steps")
    last = rows[-1] if rows else None
    if last is not None and run.status == "running":
        # metrics.csv grows while the run trains; its elapsed_s is the whole run's wall time.
        elapsed = _number(last["elapsed_s"])
        run.step = max(run.step or 0, int(last["step"]))
        if elapsed is not None and elapsed > (wall_s or 0.0):
            gpus = (summary or {}).get("gpus")
            if gpu_s is not None and gpus is not None:
                gpu_s += (elapsed - (wall_s or 0.0)) * gpus
            else:
                gpu_s = None  # no report yet: GPUs unknown
            wall_s = elapsed
    run.wall_h = wall_s / 3600 if wall_s is not None else None
    run.gpu_h = gpu_s / 3600 if gpu_s is not None else None


def higher_is_better(metric: str) -> bool:
    """The name rule: True for accuracy-like metrics (HIGHER_IS_BETTER), False otherwise."""
    name = metric.lower()
    return name in HIGHER_IS_BETTER or bool(set(name.split("_")) & HIGHER_IS_BETTER)


def main_metric(runs: Sequence[Run], metric: str, mode: str) -> tuple[str, str]:
    """The metric that orders the table and its mode: the arguments, else the runs' setting."""
    chosen = {r.best_metric for r in runs if r.best_metric[0]}
    if not metric:
        metric = next(iter(chosen))[0] if len(chosen) == 1 else "loss"
    if not mode:
        modes = {m for name, m in chosen if name == metric and m}
        mode = modes.pop() if len(modes) == 1 else ("max" if higher_is_better(metric) else "min")
    known = sorted({m for r in runs for m in r.curves})
    if known and metric not in known:
        raise DataError(f"--metric {metric!r}: not a validation metric of these runs: {known}")
    return metric, mode


def score(runs: list[Run], metric: str, mode: str) -> list[Run]:
    """Fill in final and best values (best by `mode` for `metric`); return the runs sorted."""
    for run in runs:
        for name, points in run.curves.items():
            run.final[name] = points[-1][1]
            better_max = mode == "max" if name == metric else higher_is_better(name)
            finite = [p for p in points if math.isfinite(p[1])]
            if finite:  # the first step that reached the best value
                pick = max if better_max else min
                step, value = pick(finite, key=lambda p: p[1])
                run.best[name] = (value, step)

    def key(run: Run) -> tuple[bool, float]:
        value = run.best.get(metric, (math.nan, 0))[0]
        missing = math.isnan(value)
        return missing, 0.0 if missing else (-value if mode == "max" else value)

    return sorted(runs, key=key)


def differing(runs: Sequence[Run]) -> list[str]:
    """Settings whose values are not the same in every run (run.name aside), sorted."""
    keys = sorted({k for r in runs for k in r.settings} - IGNORED)
    return [k for k in keys if len({r.settings.get(k) for r in runs}) > 1]


Cell = str | int | float | None
Column = tuple[str, list[Cell]]  # a header and the cells below it


def _fmt(value: Cell) -> str:
    """A cell for people: 4 significant digits, "-" for nothing."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.4e}"
    return str(value)


def table(runs: Sequence[Run], metric: str) -> tuple[list[str], list[list[Cell]]]:
    """Header and rows: run, status, differing settings, metrics, steps and cost."""
    settings = differing(runs)
    metrics = [metric, *sorted({m for r in runs for m in r.curves} - {metric})]
    header = ["run", "status", *settings]
    for m in metrics:
        header += [f"{m} final", f"{m} best", f"{m} best step"]
    header += ["steps", "of steps", "segments", "wall h", "GPU h"]
    rows: list[list[Cell]] = []
    for run in runs:
        row: list[Cell] = [run.name, run.status, *(run.settings.get(k) for k in settings)]
        for m in metrics:
            best = run.best.get(m)
            row += [run.final.get(m), best[0] if best else None, best[1] if best else None]
        row += [run.step, run.total_steps, run.segments, run.wall_h, run.gpu_h]
        rows.append(row)
    return header, rows


def _cut(text: str, keep_end: bool = False) -> str:
    """`text` in at most CELL characters, an ellipsis where it was cut."""
    if len(text) <= CELL:
        return text
    return "…" + text[1 - CELL :] if keep_end else text[: CELL - 1] + "…"


def _steps(run: Run) -> str:
    """Steps done of the planned ones, `26/40`; `-` for one not known."""
    if run.step is None and run.total_steps is None:
        return "-"
    return f"{_fmt(run.step)}/{_fmt(run.total_steps)}"


def _width(columns: Sequence[Column]) -> int:
    """How wide `as_text` prints these columns."""
    widths = [max([len(h), *(len(_fmt(c)) for c in cells)]) for h, cells in columns]
    return sum(widths) + 2 * (len(widths) - 1)


def short_table(
    runs: Sequence[Run], metric: str, width: int = WIDTH
) -> tuple[list[str], list[list[Cell]], list[str]]:
    """The terminal's table: header, rows and the headers of the columns left out.

    The columns of `table` less the final values and the other metrics' best steps, with the
    steps as `done/planned` and the settings' names and values cut to CELL characters (the
    run's name stays whole: it is what a pattern matches). Wider than `width`, it leaves out
    columns, the least telling first: segments, wall hours, the other metrics (the last
    first), then the settings (the last first). The run, its status, the main metric's best
    value and its step, the steps and the GPU hours always stay.
    """
    settings = differing(runs)
    others = sorted({m for r in runs for m in r.curves} - {metric})

    def best(name: str, part: int) -> list[Cell]:
        return [found[part] if (found := r.best.get(name)) else None for r in runs]

    setting_columns: list[Column] = [
        (_cut(key, keep_end=True), [_cut(_fmt(r.settings.get(key))) for r in runs])
        for key in settings
    ]
    other_columns: list[Column] = [(f"{m} best", best(m, 0)) for m in others]
    segments: Column = ("segments", [r.segments for r in runs])
    wall: Column = ("wall h", [r.wall_h for r in runs])
    columns: list[Column] = [
        ("run", [r.name for r in runs]),
        ("status", [r.status for r in runs]),
        *setting_columns,
        (f"{metric} best", best(metric, 0)),
        ("at step", best(metric, 1)),
        *other_columns,
        ("steps", [_steps(r) for r in runs]),
        segments,
        wall,
        ("GPU h", [r.gpu_h for r in runs]),
    ]
    droppable = [segments, wall, *reversed(other_columns), *reversed(setting_columns)]
    left_out = []
    while _width(columns) > width and droppable:
        gone = droppable.pop(0)
        columns = [column for column in columns if column is not gone]
        left_out.append(gone[0])
    header = [h for h, _ in columns]
    rows = [list(row) for row in zip(*(cells for _, cells in columns), strict=True)]
    return header, rows, left_out


def as_text(header: list[str], rows: list[list[Cell]]) -> str:
    """Columns aligned with spaces, for the terminal."""
    lines = [header, *([_fmt(c) for c in row] for row in rows)]
    widths = [max(len(c) for c in column) for column in zip(*lines, strict=True)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def as_markdown(header: list[str], rows: list[list[Cell]]) -> str:
    """A Markdown (GitHub) table."""
    lines = [header, ["---"] * len(header), *([_fmt(c) for c in row] for row in rows)]
    return "\n".join(
        "| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines
    )


def write_csv(path: Path, header: list[str], rows: list[list[Cell]]) -> None:
    """The table as CSV, numbers in full (empty: not known)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(["" if c is None else c for c in row] for row in rows)


def check_ours(table: Path, others: list[Path]) -> None:
    """Refuse to replace a report that `compare` did not write (a user's own notes, say).

    `compare`'s CSV starts with its header, `run,status,...`; the Markdown table and the
    figure of the same name belong to it. Anything else by those names is left alone.
    """
    try:
        ours = table.read_text(encoding="utf-8").startswith("run,status,")
    except (OSError, UnicodeDecodeError):  # none, a folder, not text: not compare's
        ours = False
    found = [path for path in (table, *others) if path.exists()]
    if found and not ours:
        raise ConfigError(
            f"--name: {found[0]} exists and compare did not write it; "
            "give the report another --name"
        )


def run_compare(
    runs_dir: Path,
    reports_dir: Path,
    patterns: Sequence[str],
    *,
    metric: str = "",
    mode: str = "",
    name: str = "compare",
    figure: bool = True,
    wide: bool = False,
) -> list[Run]:
    """Print the table; write reports/NAME.csv, .md and figures/NAME.png; return the runs.

    The printed table fits WIDTH columns, or holds every column (`wide`), as the reports do.
    A damaged run is a row of its own (status "damaged") and one line on stderr naming its file.
    """
    runs = [read_run(p) for p in select(runs_dir, patterns)]
    for run in runs:
        if run.problem:
            print(f"warning: run {run.name} is damaged: {run.problem}", file=sys.stderr)
    metric, mode = main_metric(runs, metric, mode)
    runs = score(runs, metric, mode)
    header, rows = table(runs, metric)
    written = [reports_dir / f"{name}.csv", reports_dir / f"{name}.md"]
    print(f"{len(runs)} run(s) in {runs_dir}, best {metric} ({mode}) first")
    if wide:
        print(as_text(header, rows))
    else:
        short_header, short_rows, left_out = short_table(runs, metric)
        print(as_text(short_header, short_rows))
        if left_out:
            where = f"{reports_dir.name}/{written[1].name}"
            note = f"not shown: {', '.join(left_out)}; every column: --wide, or {where}"
            print(textwrap.fill(note, WIDTH, subsequent_indent="  "))
    figure_path = reports_dir / "figures" / f"{name}.png"
    check_ours(written[0], [written[1], figure_path])
    reports_dir.mkdir(parents=True, exist_ok=True)
    write_csv(written[0], header, rows)
    written[1].write_text(as_markdown(header, rows) + "\n", encoding="utf-8")
    if figure:
        from ..observe.plots import plot_overlay  # noqa: PLC0415  (matplotlib: slow import)

        best = {r.name: r.best[metric] for r in runs[:HIGHLIGHT] if metric in r.best}
        curves = {r.name: r.curves.get(metric, []) for r in runs}
        written.append(plot_overlay(curves, best, metric, figure_path))
    for path in written:
        print(f"wrote {path}")
    return runs
