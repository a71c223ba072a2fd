"""Experiments: many runs at once.

Search spaces (`searchspace`), sweeps as Slurm job arrays or an Optuna study (`sweep`), and
the table and figure that compare runs (`compare`).

May import: the seam, `engine` (run names), `observe` (figures). Never: `ops`, `tasks`.
"""
