"""PNG figures: training curves, confusion matrix, true vs predicted, runs overlaid (`compare`).

Every figure names its run (or, `compare`'s, its runs) and the metric with its value, so a
figure copied into a report or a chat still says what it shows. matplotlib's file-only "Agg"
backend is selected explicitly: compute nodes have no display. torch is imported for type
hints only, so `compare` draws without loading it.
"""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING

from .provenance import resumed_at

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from types import ModuleType

    import torch


def _pyplot() -> ModuleType:
    import matplotlib as mpl  # noqa: PLC0415  (slow import, only when drawing)

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    module: ModuleType = plt
    return module


def plot_curves(
    run_dir: Path, out_dir: Path, best_metric: str = "", best_mode: str = "min"
) -> Path:
    """Loss (train and validation), then each validation metric, against the step.

    The title names the run and its best validation value (of `best_metric`, else the loss);
    a dotted line marks each step at which the run resumed.
    """
    with (run_dir / "metrics.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = reader.fieldnames or []
    not_metrics = {"step", "epoch", "phase", "loss", "samples_per_s", "elapsed_s"}
    metrics = [
        c
        for c in columns
        if c not in not_metrics
        and not c.startswith("lr")
        and any(r[c] for r in rows if r["phase"] == "val")
    ]
    plt = _pyplot()
    fig, axes = plt.subplots(
        1,
        1 + len(metrics),
        figsize=(5 * (1 + len(metrics)), 4.3),
        layout="constrained",
        squeeze=False,
    )
    ax_loss = axes[0][0]
    for phase in ("train", "val"):
        points = [(int(r["step"]), float(r["loss"])) for r in rows if r["phase"] == phase]
        if points:
            ax_loss.plot(
                *zip(*points, strict=True), label=phase, marker="." if phase == "val" else None
            )
    ax_loss.set(xlabel="optimizer step", ylabel="loss", yscale="log", title="loss")
    for ax, name in zip(axes[0][1:], metrics, strict=True):
        points = [(int(r["step"]), float(r[name])) for r in rows if r["phase"] == "val" and r[name]]
        ax.plot(*zip(*points, strict=True), marker=".", color="tab:orange")
        ax.set(xlabel="optimizer step", ylabel=name, title=f"validation {name}")
    for step in resumed_at(run_dir):
        for ax in axes[0]:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
        ax_loss.plot([], [], color="grey", linestyle=":", label=f"resumed at {step}")
    ax_loss.legend()
    fig.suptitle(f"run {run_dir.name}" + best_text(rows, best_metric, best_mode))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "curves.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def best_text(rows: list[dict[str, str]], best_metric: str, best_mode: str) -> str:
    """`: best validation <metric> <value> at step <n>`, from the rows ('' when none)."""
    name = best_metric or "loss"
    scored = [(float(r[name]), int(r["step"])) for r in rows if r["phase"] == "val" and r.get(name)]
    if not scored:
        return ""
    pick = min if (best_mode if best_metric else "min") == "min" else max
    value, step = pick(scored, key=lambda vs: vs[0])
    return f": best validation {name} {value:.4g} at step {step}"


def run_title(out_dir: Path, split: str, metrics: dict[str, float]) -> str:
    """`run 4711_3: test, accuracy 0.953`: a split's figure title.

    `out_dir` is the run's figure folder, reports/figures/<run> (the trainer's and
    `evaluate`'s), so its name is the run's.
    """
    values = "".join(f", {name} {value:.4g}" for name, value in metrics.items())
    return f"run {out_dir.name}: {split}{values}"


def plot_confusion(
    matrix: torch.Tensor,
    classes: Sequence[str],
    out_dir: Path,
    title: str,
    name: str = "confusion_matrix.png",
) -> Path:
    """Heat map of a confusion matrix with the counts written in the cells."""
    plt = _pyplot()
    size = max(4.0, 0.5 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size, size), layout="constrained")
    ax.imshow(matrix.tolist(), cmap="Blues")
    ticks = range(len(classes))
    ax.set(
        xticks=ticks,
        yticks=ticks,
        xticklabels=classes,
        yticklabels=classes,
        xlabel="predicted",
        ylabel="true",
        title=title,
    )
    threshold = matrix.max().item() / 2
    for (i, j), count in zip(
        ((i, j) for i in ticks for j in ticks), matrix.flatten().tolist(), strict=True
    ):
        ax.text(
            j,
            i,
            str(count),
            ha="center",
            va="center",
            fontsize=8,
            color="white" if count > threshold else "black",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_true_vs_predicted(
    hist: torch.Tensor, edge: float, out_dir: Path, title: str, name: str
) -> Path:
    """Heat map of a 2-D histogram of (true, predicted) values over [-edge, edge]."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5), layout="constrained")
    ax.imshow(
        hist.T.log1p().tolist(), origin="lower", extent=(-edge, edge, -edge, edge), cmap="Blues"
    )
    ax.plot([-edge, edge], [-edge, edge], color="tab:red", linewidth=0.8)
    ax.set(xlabel="true (standardised)", ylabel="predicted", title=title)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_overlay(
    curves: dict[str, list[tuple[int, float]]],
    best: dict[str, tuple[float, int]],
    metric: str,
    path: Path,
) -> Path:
    """Validation `metric` against the step, one line per run; the `best` runs in colour.

    `best` holds the runs drawn in colour, best first, with their best value and its step:
    each is marked on its line with the value written beside it, and named in the legend.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for name, points in curves.items():
        if points and name not in best:
            ax.plot(*zip(*points, strict=True), color="0.75", linewidth=0.8)
    for rank, (name, (value, step)) in enumerate(best.items(), 1):  # last: on top of the others
        if curves.get(name):
            label = f"{rank}. {name}: {value:.4g} at step {step}"
            (line,) = ax.plot(
                *zip(*curves[name], strict=True), marker=".", linewidth=2, label=label
            )
            ax.plot(step, value, marker="o", markersize=9, fillstyle="none", color=line.get_color())
            ax.annotate(
                f"{value:.4g}",
                (step, value),
                xytext=(6, 6),
                textcoords="offset points",
                color=line.get_color(),
                fontsize=8,
            )
    others = sum(1 for n, p in curves.items() if p and n not in best)
    title = f"validation {metric}: {len(curves)} runs" + (f", {others} in grey" if others else "")
    ax.set(xlabel="optimizer step", ylabel=metric, title=title)
    if metric == "loss":
        ax.set_yscale("log")
    if best:
        ax.legend(title=f"best {metric}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
