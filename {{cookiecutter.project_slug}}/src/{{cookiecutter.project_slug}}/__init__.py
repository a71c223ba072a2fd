"""Training package of this project: a map of its rooms is in docs/package-map.md.

Yours: `tasks/` (one module per research problem) and `models.py` (architectures). A task
imports everything it needs from `api`. The top level holds the seam between your code and
the rest (`task.py`, `task_kinds.py`, `config.py`, `errors.py`, `settings.py`) and the
commands (`cli.py`). The wings do the work: `engine/` trains, `data/` guards and serves data,
`observe/` records what happens, `experiments/` runs and compares many runs, `ops/` plans,
checks and exports, `blocks/` holds network building blocks.
"""

__version__ = "0.1.0"
