"""Moved to `data.shards` (template release 0.3.0); tasks import from `api`.

This module re-exports the old names for one release, with a warning; it goes in the next.
"""

from . import moved
from .data.shards import ShardReader, write_shards

__all__ = ["ShardReader", "write_shards"]

moved.warn(__name__, "data.shards")
