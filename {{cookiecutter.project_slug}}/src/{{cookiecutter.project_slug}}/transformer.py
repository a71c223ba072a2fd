"""Moved to `blocks.transformer` (template release 0.3.0); tasks import from `api`.

This module re-exports the old names for one release, with a warning; it goes in the next.
"""

from . import moved
from .blocks.transformer import Block, CausalLM, LoRA, LowRank

__all__ = ["Block", "CausalLM", "LoRA", "LowRank"]

moved.warn(__name__, "blocks.transformer")
