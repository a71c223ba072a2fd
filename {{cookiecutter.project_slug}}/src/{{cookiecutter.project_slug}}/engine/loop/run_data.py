"""The data a run trains on, as its checkpoints and the source record know it.

At the start, rank 0 takes the digest of the processed data (`SHA256SUMS` of `prepare`) and of
each file a stream reads from elsewhere, checking those against the committed source record
(`data.sources`); every rank gets the same answer, or the same one-line refusal. A resume is
refused on data other than its checkpoint's, except the files its last segment stopped on as
damaged (their repair is what that stop asked for). At a segment's end, a stream's files go
into the source record when every read went well; after a failed read, `read_stop` says so.
"""

from pathlib import Path
from typing import Any

from ...data.failures import ReadFailure
from ...data.processed import check_same_data, data_files, processed_digest, record_sources
from ...errors import DataError
from ...settings import Settings
from ...task import Task
from ..parallel import distributed
from . import read_stop


class RunData:
    """The processed data and a stream's own files of one run (see the module)."""

    def __init__(
        self, task: Task, train_set: object, settings: Settings, denv: distributed.DistEnv
    ) -> None:
        """Nothing is read yet but the processed data's `SHA256SUMS`."""
        self.folder, self.settings, self.denv = task.processed_dir, settings, denv
        self.sources: list[Path] = getattr(train_set, "source_files", list)()  # a stream's
        self.digest = processed_digest(self.folder)  # the SHA256SUMS of prepare
        self.files: dict[str, str] = {}

    def check(self) -> None:
        """Sum the run's data files (rank 0; cached by metadata), checked against the record."""
        found, problem = None, None
        if self.denv.is_main:
            try:
                found = data_files(self.folder, self.sources, self.settings)
            except DataError as err:  # raised on every rank below, in the same line
                problem = str(err)
        found, problem = distributed.broadcast_object((found, problem))
        if problem:
            raise DataError(problem)
        self.files = dict(found)

    def same_as(self, state: dict[str, Any], run: str, run_dir: Path) -> None:
        """Refuse a resume on data other than the checkpoint `state`'s (see the module)."""
        check_same_data(
            state.get("data"),
            self.digest,
            run,
            self.folder,
            (state.get("data_files"), self.files),
            repaired=read_stop.repaired(run_dir),
        )

    def checkpointed(self) -> dict[str, Any]:
        """What a checkpoint records of the data."""
        return {"data": self.digest, "data_files": self.files}

    def ended(
        self, failure: ReadFailure | None, stopped: bool, run_dir: Path, kept: tuple[int, int]
    ) -> tuple[str, list[str]]:
        """A segment's last word on its data (rank 0's line, or ""), and the damaged files.

        `stopped`: a read failed on some process (every one calls this); `failure`: this
        process's; `kept`: the newest checkpoint's step and the steps done in this segment.
        """
        if not stopped:
            line = (
                record_sources(self.folder, self.sources, self.settings)
                if self.denv.is_main
                else ""
            )
            return line, []
        found = distributed.gather_objects(failure)
        damaged = read_stop.damaged(found, self.files, self.settings.data_dir)
        line = read_stop.report(found, run_dir, run_dir.name, *kept) if self.denv.is_main else ""
        return line, damaged
