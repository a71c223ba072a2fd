"""Ready-made loss, metrics and figures for the two most common kinds of task.

Subclass `Classification` or `Regression` and write only the data and the model; batches are
`(inputs, targets)` pairs. For anything else, subclass `task.Task` directly.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from .errors import ConfigError
from .observe.plots import plot_confusion, plot_true_vs_predicted, run_title
from .task import Batch, Task


class Classification(Task):
    """Cross-entropy on logits; accuracy and a confusion matrix; AUROC where asked for.

    `datasets` sets `self.classes` (the class names, index = label), or the class names them
    (`classes = ("cat", "dog")`: a tuple, which neither ruff nor mypy objects to). With
    "auroc" among the task's metrics (`metrics = ("loss", "accuracy", "auroc")`, or
    `add_metrics("auroc")`), `evaluate` keeps every sample's class probabilities and label
    and `summarize` computes the macro one-vs-rest AUROC over the whole split with
    torchmetrics (the `metrics` extra).
    """

    metrics: ClassVar[tuple[str, ...]] = ("loss", "accuracy")
    classes: Sequence[str]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy of the batch."""
        inputs, labels = batch
        return nn.functional.cross_entropy(model(inputs).float(), labels)

    def evaluate(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Loss sum, sample count and confusion counts [true, predicted]."""
        inputs, labels = batch
        logits = model(inputs).float()
        n = len(self.classes)
        predicted = logits.argmax(dim=1)
        confusion = torch.bincount(labels * n + predicted, minlength=n * n).reshape(n, n)
        if "auroc" in self.metrics:  # not a sum: every sample's scores, kept
            self.keep("probabilities", logits.softmax(dim=1))
            self.keep("labels", labels)
        return {
            "loss": nn.functional.cross_entropy(logits, labels, reduction="sum"),
            "count": torch.tensor(float(len(labels)), device=labels.device),
            "confusion": confusion,
        }

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Mean loss and accuracy (and AUROC, when a metric of the task)."""
        count = max(sums["count"].item(), 1.0)
        metrics = {"loss": sums["loss"].item() / count, "accuracy": accuracy(sums["confusion"])}
        if "auroc" in self.metrics:
            metrics["auroc"] = auroc(sums["probabilities"], sums["labels"], len(self.classes))
        return metrics

    def figures(self, sums: dict[str, torch.Tensor], out_dir: Path, split: str) -> list[Path]:
        """The confusion matrix of the split, titled with the run and the accuracy."""
        name = "confusion_matrix.png" if split == "val" else f"confusion_matrix_{split}.png"
        confusion = sums["confusion"].cpu()
        title = run_title(out_dir, split, {"accuracy": accuracy(confusion)})
        return [plot_confusion(confusion, self.classes, out_dir, title, name)]


def accuracy(confusion: torch.Tensor) -> float:
    """The share of samples on the diagonal of a [true, predicted] confusion count."""
    return float(confusion.diag().sum()) / max(float(confusion.sum()), 1.0)


def auroc(probabilities: torch.Tensor, labels: torch.Tensor, classes: int) -> float:
    """Macro one-vs-rest area under the ROC curve (torchmetrics; the `metrics` extra)."""
    from torchmetrics.functional.classification import multiclass_auroc  # noqa: PLC0415

    return float(multiclass_auroc(probabilities, labels, num_classes=classes, average="macro"))


def need_torchmetrics(field: str) -> None:
    """ConfigError naming `field` when the `metrics` extra (torchmetrics) is not installed."""
    try:
        import torchmetrics  # noqa: F401, PLC0415
    except ModuleNotFoundError:
        raise ConfigError(
            f"{field}: needs torchmetrics, the metrics extra: pip install -e '.[metrics]'"
        ) from None


class Regression(Task):
    """Mean squared error on every output; RMSE, R² and a true-vs-predicted histogram.

    Targets are float tensors of shape N x outputs; `datasets` should standardise them
    (mean 0, standard deviation 1 on the training split) so that the loss weighs outputs
    equally and the figure's range `figure_range` covers them.
    """

    metrics: ClassVar[tuple[str, ...]] = ("loss", "rmse", "r2")
    figure_range: ClassVar[float] = 3.0  # the histogram covers [-range, range] on both axes
    figure_bins: ClassVar[int] = 48

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean squared error of the batch."""
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs).float(), targets)

    def evaluate(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Per-output sums of squared errors, targets and squared targets; a 2-D histogram."""
        inputs, targets = batch
        predicted = model(inputs).float()
        edge, bins = self.figure_range, self.figure_bins
        cells = (torch.stack([targets, predicted]).clamp(-edge, edge * 0.9999) + edge) / (2 * edge)
        cells = (cells * bins).long()
        hist = torch.bincount((cells[0] * bins + cells[1]).flatten(), minlength=bins * bins)
        return {
            "sse": ((predicted - targets) ** 2).sum(dim=0),
            "target_sum": targets.sum(dim=0),
            "target_sq_sum": (targets**2).sum(dim=0),
            "count": torch.tensor(float(len(targets)), device=targets.device),
            "hist": hist.reshape(bins, bins),
        }

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """MSE (the loss), RMSE over all outputs, and R² averaged over the outputs."""
        n = max(sums["count"].item(), 1.0)
        sse = sums["sse"].double()
        total = (sums["target_sq_sum"].double() - sums["target_sum"].double() ** 2 / n).clamp(
            min=1e-12
        )
        mse = sse.sum().item() / (n * sse.numel())
        return {"loss": mse, "rmse": mse**0.5, "r2": (1 - sse / total).mean().item()}

    def figures(self, sums: dict[str, torch.Tensor], out_dir: Path, split: str) -> list[Path]:
        """A 2-D histogram of (true, predicted) values of every output; RMSE and R² in its title.

        Both as this class computes them: the histogram comes from its own `evaluate`.
        """
        name = "true_vs_predicted.png" if split == "val" else f"true_vs_predicted_{split}.png"
        metrics = Regression.summarize(self, sums)
        title = run_title(out_dir, split, {"rmse": metrics["rmse"], "r2": metrics["r2"]})
        return [plot_true_vs_predicted(sums["hist"].cpu(), self.figure_range, out_dir, title, name)]
