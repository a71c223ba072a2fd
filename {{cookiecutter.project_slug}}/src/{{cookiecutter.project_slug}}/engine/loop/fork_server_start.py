"""Imported first by the fork server of a stream's workers (`stream_batches.fork_server`).

Slurm signals every process of a job step, the fork server too: a stop signal (SIGUSR1 before
the time limit, SIGTERM) would end it, and its workers with it, while the training process
writes its checkpoint. Importing this module, the server leaves them to the training process,
as the workers do; the workers it forks inherit that.
"""

from ..parallel.preemption import ignore_stop_signals

ignore_stop_signals()
