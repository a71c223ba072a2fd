"""Moved to `data.shards` (template release 0.3.0); tasks import from `api`.

This module re-exports the old names for one release, with a warning; it goes in the next.
"""

import warnings

from .data.shards import ShardReader, write_shards

__all__ = ["ShardReader", "write_shards"]

warnings.warn(
    f"{__name__} moved to {__package__}.data.shards (template release 0.3.0): import from "
    f"{__package__}.api instead (in a task: from ..api import ...). The old path goes in the "
    "next release.",
    FutureWarning,
    stacklevel=2,
)
