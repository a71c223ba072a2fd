"""Tasks written for the tests: they make their own data, so the suite never depends on data/raw.

Pick one by its module path, e.g. `task.name=toy_tasks.blobs` (the tests folder is on the path).
"""
