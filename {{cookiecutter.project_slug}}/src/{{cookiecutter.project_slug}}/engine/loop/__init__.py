"""The loop: the order of a run's events, unaware of the strategy and of the format on disk.

Owns: trainer, update, averaging, batches, stream batches, loading, evaluation, rng, sizes.
May import: the seam, data, observe, the engine's helpers, parallel, state's front door only.
"""
