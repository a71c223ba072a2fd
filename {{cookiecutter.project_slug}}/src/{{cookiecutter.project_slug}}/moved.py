"""The import paths that moved in template release 0.3.0, kept for one release with a warning.

Tasks written for 0.2.0 import `..shards`, `..pretrained`, `..transformer` and names of the
former `..data` module; those modules re-export the names from their new place and call
`warn` once when first imported. The next release removes them and this module.
"""

import warnings


def warn(old: str, new: str) -> None:
    """Say once, as a FutureWarning (shown by default), that `old` is now `new`."""
    package = old.partition(".")[0]
    warnings.warn(
        f"{old} moved to {package}.{new} (template release 0.3.0): import from "
        f"{package}.api instead (in a task: from ..api import ...). The old path goes in the "
        "next release.",
        FutureWarning,
        stacklevel=3,
    )
