"""`export`: a run's weights as one safetensors file with the run's configuration beside it.

For inference or sharing: `<out>/model.safetensors` holds every tensor of the model (fp32 or
bf16), `<out>/config.toml` the configuration the run trained with, so the task's
`build_model` rebuilds the network and `model.init_from = "<out>"` starts another run from it.
safetensors holds tensors only: reading it runs no code, unlike a pickle.

The weights come from `engine/run_weights.py`, the one place that knows where a run keeps its
final and best weights (a frozen base left out of a checkpoint is completed from the run's
`model.init_from`).
"""

import json
import os
from pathlib import Path

import torch

from ..config import to_toml
from ..data.processed import swapped_in
from ..engine.run_weights import load_weights_for_run, with_frozen_base
from ..errors import ConfigError
from ..settings import Settings
from ..task import config_from_dict

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODEL_FILE = "model.safetensors"
# Written into every export folder: the run it came from. `export` replaces only a folder that
# holds this record for the same run; any other existing path is refused, never overwritten.
RECORD = "export.json"


def check_out(out_dir: Path, run_dir: Path) -> None:
    """Refuse an `out_dir` that exists and is not an earlier export of the same run."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    try:  # a file, a folder without the record or a damaged record: not an export of ours
        earlier = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = None
    if out_dir.is_symlink() or not isinstance(earlier, dict) or earlier.get("run") != run_dir.name:
        raise ConfigError(
            f"--out {out_dir}: exists and is not an earlier export of run {run_dir.name} "
            f"(no {RECORD} naming it); export writes only a new folder or replaces its own"
        )


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy; floating tensors in `dtype`, integer buffers (counters) as they are.

    A copy for every tensor: safetensors refuses tensors that share memory (tied weights).
    """
    target = dtype if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to(dtype=target, copy=True).contiguous()


def export_run(
    run_dir: Path, out_dir: Path, settings: Settings, which: str = "final", dtype: str = "fp32"
) -> Path:
    """Write `out_dir/model.safetensors` and `out_dir/config.toml`; return `out_dir`.

    Written into a temporary folder beside `out_dir` and renamed into place: an interrupted
    export leaves the previous one (or none), never half a file. `out_dir` must be new or an
    earlier export of this run (`check_out`).
    """
    # Imported here: only `export` needs it; every other command starts without it.
    from safetensors.torch import save_file  # noqa: PLC0415

    check_out(out_dir, run_dir)
    found = load_weights_for_run(run_dir, which)
    weights = with_frozen_base(found, settings)
    tensors = {name: _cast(t, DTYPES[dtype]) for name, t in weights.items()}
    config_text = to_toml(config_from_dict(found.config))
    with swapped_in(out_dir) as tmp:
        metadata = {"run": run_dir.name, "step": str(found.step), "weights": which}
        save_file(tensors, tmp / MODEL_FILE, metadata=metadata)
        (tmp / "config.toml").write_text(config_text, encoding="utf-8")
        (tmp / RECORD).write_text(json.dumps({**metadata, "dtype": dtype}) + "\n", "utf-8")
        for path in tmp.iterdir():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    return out_dir
