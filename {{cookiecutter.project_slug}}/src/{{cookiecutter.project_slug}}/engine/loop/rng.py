"""Every random generator's state of a process: saved in checkpoints, restored on resume."""

import random
from typing import Any

import numpy as np
import torch


def rng_state(device: torch.device) -> dict[str, Any]:
    """All random generator states of this process (as types `torch.load` reads safely)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {
        "python": random.getstate(),
        "numpy": [torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
        # This process's GPU only: the next start may see fewer GPUs (one per task).
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    random.setstate(state["python"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # on the current device
