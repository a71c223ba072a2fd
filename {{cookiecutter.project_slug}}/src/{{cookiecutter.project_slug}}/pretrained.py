"""Moved to `data.pretrained` (template release 0.3.0); tasks import from `api`.

This module re-exports the old names for one release, with a warning; it goes in the next.
"""

from . import moved
from .data.pretrained import FIELD, INDEX, SINGLE, read_weights

__all__ = ["FIELD", "INDEX", "SINGLE", "read_weights"]

moved.warn(__name__, "data.pretrained")
