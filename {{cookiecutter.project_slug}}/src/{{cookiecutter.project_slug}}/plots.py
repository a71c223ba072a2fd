"""PNG figures: training curves from metrics.csv and a confusion matrix.

matplotlib's file-only "Agg" backend is selected explicitly: compute nodes have no display.
"""

import csv
from pathlib import Path
from types import ModuleType

import torch


def _pyplot() -> ModuleType:
    import matplotlib as mpl  # noqa: PLC0415  (slow import, only when drawing)

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def plot_curves(metrics_csv: Path, out_dir: Path) -> Path:
    """Loss (train and validation) and validation accuracy against the step."""
    with metrics_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for phase in ("train", "val"):
        points = [(int(r["step"]), float(r["loss"])) for r in rows if r["phase"] == phase]
        if points:
            ax_loss.plot(
                *zip(*points, strict=True), label=phase, marker="." if phase == "val" else None
            )
    points = [(int(r["step"]), float(r["accuracy"])) for r in rows if r["phase"] == "val"]
    if points:
        ax_acc.plot(*zip(*points, strict=True), marker=".", color="tab:orange")
    ax_loss.set(xlabel="optimizer step", ylabel="loss", yscale="log", title="loss")
    ax_loss.legend()
    ax_acc.set(xlabel="optimizer step", ylabel="accuracy", title="validation accuracy")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "curves.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def confusion_matrix(labels: torch.Tensor, predictions: torch.Tensor, n: int) -> torch.Tensor:
    """Counts[true, predicted]."""
    flat = labels.long() * n + predictions.long()
    return torch.bincount(flat, minlength=n * n).reshape(n, n)


def plot_confusion(
    matrix: torch.Tensor,
    classes: list[str],
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
