"""Your research problems, one module each: `task.name = "<module>"` picks one.

A module defines a `task.Task` subclass (or a `task_kinds.Classification` / `Regression`
one) and names it in `TASK = ...`; its settings go in `configs/tasks/<module>.toml`.
"""
