"""After the training data failed to read: the run's one line, and the tracebacks in its log.

Every process has stopped at the same step (`stream_batches`, `batches`); the trainer has
written the checkpoint of that step, the last good one, unless no step was done. Here rank 0
writes each failed process's traceback to `runs/<name>/errors.log` and says the first
failure in one line: the cause, the file, the worker and process, the checkpoint, the exit
code and what to do. The other processes say nothing: there is one cause, not one per rank.

The files the failures name go into the segment's `summary.json` as `damaged`. A checkpoint
records the digest of each file a stream reads from elsewhere, and a resume refuses a file
that changed since: except these, whose repair is what the line asked for (`repaired`).
"""

import datetime
import json
from pathlib import Path

from ...data.failures import ReadFailure

EXIT_DATA = 6
"""Exit code of `train` meaning: the training data failed to read; the last good step is kept."""

LOG = "errors.log"


def report(
    failures: list[ReadFailure | None], run_dir: Path, run: str, saved: int, steps: int
) -> str:
    """Log every failure's traceback in the run's errors.log; the line that says the first.

    `failures`: one entry per process (None where its reading went well); `saved`: the step of
    the run's newest checkpoint (-1: none); `steps`: steps done in this segment (0: none, so
    nothing was written now).
    """
    kept = f"checkpoint at step {saved} written" if steps else "no step done in this segment"
    if not steps:
        kept += f", the last checkpoint is step {saved}" if saved >= 0 else ", nothing saved"
    found = [failure for failure in failures if failure is not None]
    log = run_dir / LOG
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with log.open("a", encoding="utf-8") as out:
        for failure in found:
            out.write(f"--- {now} run {run}: {failure.line()}\n{failure.traceback}\n")
    more = f" (and {len(found) - 1} more process(es))" if len(found) > 1 else ""
    first = found[0].line() if found else "a process's data failed"
    return (
        f"error: reading the training data failed: {first}{more}; {kept}, exit {EXIT_DATA} "
        f"(traceback in {log}): repair or replace the file, then start run.name={run} "
        "again to continue from there"
    )


def damaged(failures: list[ReadFailure | None], files: dict[str, str], data_dir: Path) -> list[str]:
    """The names in `files` (the run's `data_files`) of the files that `failures` name."""
    named = []
    for name in files:
        path = (Path(name) if name.startswith("/") else data_dir / name).resolve()
        for failure in filter(None, failures):
            if str(path) in failure.cause or (
                failure.file and Path(failure.file).resolve() == path
            ):
                named.append(name)
                break
    return named


def repaired(run_dir: Path) -> list[str]:
    """The files the run's last segment stopped on as damaged (its summary.json's `damaged`)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: nothing is excused
        return []
    found = summary.get("damaged", []) if isinstance(summary, dict) else []
    return [name for name in found if isinstance(name, str)]
