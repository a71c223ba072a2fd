"""The state on disk: checkpoints, their files and checks, and the weights of runs and models.

Owns: checkpoint (the format), shard_files, checkpoint_io, run_weights, initial_weights.
May import: the seam, data, parallel.distributed. Never: loop, which uses the names below only.
"""

from .checkpoint import (
    load_latest,
    load_model,
    lock_run_dir,
    remove_stale_tmp,
    run_id,
    save_atomic,
)
from .checkpoint_io import Checkpointer
from .run_weights import RunWeights, used_weights, with_frozen_base

__all__ = [
    "Checkpointer",
    "RunWeights",
    "load_latest",
    "load_model",
    "lock_run_dir",
    "remove_stale_tmp",
    "run_id",
    "save_atomic",
    "used_weights",
    "with_frozen_base",
]
