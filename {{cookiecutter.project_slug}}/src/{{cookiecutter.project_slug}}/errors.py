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
