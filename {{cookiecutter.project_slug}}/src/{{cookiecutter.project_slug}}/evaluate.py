"""`evaluate`: score a run's latest checkpoint on the test split."""

import json
from pathlib import Path
from typing import Any

from .data import load_splits, processed_path
from .distributed import DistEnv
from .errors import CheckpointError
from .models import build_model
from .plots import confusion_matrix, plot_confusion
from .runtime import autocast_dtype, pick_device
from .settings import Settings
from .trainer import evaluate_split, load_run


def latest_run(runs_dir: Path) -> Path:
    """The most recently modified run directory."""
    runs = [p for p in runs_dir.glob("*/checkpoints") if p.is_dir()] if runs_dir.is_dir() else []
    if not runs:
        raise CheckpointError(f"no runs with checkpoints in {runs_dir}: train first")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def evaluate_run(run_dir: Path, settings: Settings, device_name: str = "auto") -> dict[str, Any]:
    """Test loss and accuracy; writes `evaluation.json` and a confusion matrix figure."""
    cfg, state = load_run(run_dir)
    splits = load_splits(processed_path(cfg, settings))
    device = pick_device(device_name, DistEnv())
    model = build_model(cfg.model, splits.input_shape, len(splits.classes)).to(device)
    model.load_state_dict(state["model"])
    dtype = autocast_dtype(cfg.train.precision, device)
    loss, accuracy, predicted = evaluate_split(
        model,
        splits.test,
        batch_size=4 * cfg.train.batch_size,
        denv=DistEnv(),
        device=device,
        dtype=dtype,
    )
    result = {
        "run": run_dir.name,
        "step": state["position"]["step"],
        "split": "test",
        "samples": len(splits.test),
        "loss": loss,
        "accuracy": accuracy,
    }
    (run_dir / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    matrix = confusion_matrix(splits.test.y, predicted, len(splits.classes))
    figure = plot_confusion(
        matrix,
        splits.classes,
        settings.figures_dir / run_dir.name,
        "test split",
        name="confusion_matrix_test.png",
    )
    result["figure"] = str(figure)
    result["per_class_accuracy"] = (matrix.diag() / matrix.sum(1).clamp(min=1)).tolist()
    return result
