"""Run names: a run's directory is always one folder directly below the runs folder."""

import re

from ..errors import ConfigError

# One path component that is neither hidden nor a dot name: `..`, `/abs` or `a/b` would put
# checkpoints and metrics outside runs/ or into nested folders.
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
MAX_RUN_NAME = 100


def check_run_name(name: str, source: str) -> str:
    """Return `name` if it is a safe run name, else raise ConfigError naming `source`."""
    if len(name) > MAX_RUN_NAME or not _RUN_NAME.fullmatch(name):
        shown = name if len(name) <= 40 else f"{name[:40]}... ({len(name)} characters)"
        raise ConfigError(
            f"{source} {shown!r}: a run name is one folder below runs/: letters, digits and "
            f"'.', '_', '=', '+', '-', starting with a letter or digit, at most {MAX_RUN_NAME}"
        )
    return name


def check_given(name: str, env_name: str) -> None:
    """Check the run name a user gave: config run.name, else the RUN_NAME variable."""
    if name:
        check_run_name(name, "run.name")
    elif env_name:
        check_run_name(env_name, "RUN_NAME")
