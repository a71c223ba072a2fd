"""Expected failures: the command line prints them as one line and exits with `exit_code`."""


class ProjectError(Exception):
    """A failure the user can fix from the message alone (exit code 1)."""

    exit_code = 1


class ConfigError(ProjectError, ValueError):
    """A configuration key or value is invalid (exit code 2, like other usage errors)."""

    exit_code = 2


class DataError(ProjectError):
    """Missing or malformed data."""


class CheckpointError(ProjectError):
    """No usable checkpoint where one is required."""


class NoIntactCheckpointError(CheckpointError):
    """A run has checkpoints but none is intact: it stops instead of starting from scratch.

    Exit code 5: the job scripts (slurm/common.sh) requeue only on exit 3, so such a job ends
    with this code and leaves the checkpoints for a person to look at.
    """

    exit_code = 5


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def crash_line(err: BaseException, env: dict[str, str]) -> str:
    """One line for an unexpected error: its type, message and where it happened.

    An error raised in a DataLoader worker arrives as a multi-line message ("Caught X in
    DataLoader worker process N", then the worker's traceback); its last line is the cause.
    Under several processes the line names this process's rank.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    cause = f"{type(err).__name__}: {lines[0] if lines else '(no message)'}"
    if lines and lines[0].startswith("Caught ") and "Original Traceback" in str(err):
        worker = lines[0].removeprefix("Caught ").split(" in ", 1)[-1].rstrip(".")
        cause = f"{lines[-1]} (in {worker})"
    rank, world = (
        (env.get("RANK"), env.get("WORLD_SIZE"))
        if "RANK" in env
        else (env.get("SLURM_PROCID"), env.get("SLURM_NTASKS"))
    )
    return f"rank {rank}: {cause}" if rank is not None and world not in (None, "1") else cause
