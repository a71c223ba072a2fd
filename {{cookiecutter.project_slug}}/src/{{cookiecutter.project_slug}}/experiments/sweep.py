"""`sweep`: a search space (configs/sweep.toml) -> the run list and one Slurm job array.

grid and random: the runs' `key=value` lines go to runs/.sweeps/<name>/runs.txt, read by
slurm/sweep.sbatch one line per array task, and the array is submitted with as many tasks as
lines. optuna (the `sweep` extra): the study lives in a journal file next to it (a plain file
on the shared file system, no database server); each array task runs `sweep --trial`, which
claims a trial, trains it as an ordinary run named after the trial number, reports every
validation to it (pruning) and tells the study the result. A requeued task finds its own
trial again, so it resumes its run and reports to the same trial.
"""

import dataclasses
import json
import math
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ProjectError
from ..settings import Settings
from . import searchspace
from .searchspace import Space

JOB_SCRIPT = "slurm/sweep.sbatch"


def sweep_dir(space: Space, settings: Settings) -> Path:
    """The sweep's own files, beside its runs (a hidden folder: never taken for a run)."""
    return settings.runs_dir / ".sweeps" / space.name


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _write_once(path: Path, text: str, what: str, name: str) -> None:
    """Write `text` to `path`; an existing different file means a reused sweep name."""
    if path.exists() and path.read_text(encoding="utf-8") != text:
        raise ConfigError(
            f"sweep.name {name!r}: {path} holds another {what}; give the sweep a new name "
            "(or delete that folder to start it again)"
        )
    _write_whole(path, text)


def _write_whole(path: Path, text: str) -> None:
    """Write a file whole or not at all (a task may read it at any moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _need_sbatch() -> None:
    """Before anything is written: a sweep is submitted from a machine with Slurm."""
    if shutil.which("sbatch") is None:
        raise ProjectError(
            "sbatch: command not found: run `sweep` on the cluster's login node "
            "(`sweep --dry-run` shows the runs anywhere)"
        )


def _submit(args: list[str], root: Path, dry_run: bool) -> str:
    command = ["sbatch", "--parsable", *args]
    print("submit:", shlex.join(command))
    if dry_run:
        return ""
    # sbatch and its arguments, no shell: the values were checked as settings
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[-1]
        raise ProjectError(f"sbatch failed (exit {done.returncode}): {said}")
    return done.stdout.strip().split(";")[0]


def _array(tasks: int, space: Space) -> str:
    return f"--array=0-{tasks - 1}%{min(space.concurrency, tasks)}"


def _checked_config(config: Path | None, settings: Settings) -> Path | None:
    """The config file the runs will read: --config, else configs/train.toml (as `train`)."""
    default = settings.project_root / "configs" / "train.toml"
    return config or (default if default.is_file() else None)


def run_sweep(
    space_path: Path, extra: list[str], config: Path | None, settings: Settings, dry_run: bool
) -> int:
    """Expand the space, check every run's settings, write the run list, submit the array.

    `config`: the --config given to `sweep`, passed on to every run (None: the default).
    """
    space = searchspace.load_space(space_path)
    task_dir = settings.project_root / "configs" / "tasks"
    folder = sweep_dir(space, settings)
    if "," in str(folder):  # sbatch --export separates variables with commas
        raise ConfigError(f"RUNS_DIR: {settings.runs_dir} has a comma; sbatch cannot pass it")
    if space.method == "optuna":
        return _start_study(space, extra, config, settings, dry_run)
    draws = searchspace.points(space)
    names = [searchspace.run_name(space.name, i, len(draws)) for i in range(len(draws))]
    runs = [searchspace.overrides(space, p, n, extra) for p, n in zip(draws, names, strict=True)]
    searchspace.check_runs(space, runs, _checked_config(config, settings), task_dir)
    lines = [" ".join(items) for items in runs]
    header = f"# sweep {space.name} ({space.method}): one run per line, `key=value` settings\n"
    text = header + "\n".join(lines) + "\n"
    print("\n".join(lines))
    listing = folder / "runs.txt"
    config_arg = [f"--config={config}"] if config else []  # sbatch passes it to every task
    created = not listing.exists()
    if not dry_run:
        _need_sbatch()
        _write_once(listing, text, "run list", space.name)
    try:
        job = _submit(
            [
                _array(len(lines), space),
                f"--export=ALL,SWEEP_FILE={_shown(listing, settings.project_root)}",
                JOB_SCRIPT,
                *config_arg,
            ],
            settings.project_root,
            dry_run,
        )
    except ProjectError:  # nothing was submitted: a list written now goes too, for a retry
        if created:
            listing.unlink(missing_ok=True)
        raise
    what = f"{len(lines)} runs {names[0]}..{names[-1]}, at most {space.concurrency} at a time"
    print(f"dry run: {what}" if dry_run else f"submitted array job {job}: {what}")
    return 0


# --- Optuna -------------------------------------------------------------------------------


def _optuna() -> Any:
    try:
        import optuna  # noqa: PLC0415  (optional extra)
    except ModuleNotFoundError:
        raise ConfigError(
            "sweep.method = 'optuna' needs the sweep extra: pip install -e '.[sweep]' "
            "(uv: uv sync --extra sweep); optuna is not installed"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def check_journal(path: Path) -> None:
    """ConfigError naming `path` and the rule when the journal is damaged; nothing is changed.

    Every record is one JSON line with its `op_code`. A last line without its newline is a
    record cut off by a kill or a full disk: Optuna reads past it, but its next record would be
    appended onto it and make the whole study unreadable, so it is refused, with the command
    that cuts it off. Read under the journal's own lock, so a record being written is not
    mistaken for a cut one.
    """
    from optuna.storages.journal import JournalFileSymlinkLock  # noqa: PLC0415

    if not path.is_file():
        return  # a new study
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        data = path.read_bytes()
    finally:
        lock.release()
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):
        try:
            record = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("op_code"), int):
            raise ConfigError(
                f"{path}:{number}: not an Optuna journal record (the file is damaged): restore "
                "it from a copy, or start the sweep again under another sweep.name"
            )
    if lines[-1]:
        whole = len(data) - len(lines[-1])
        raise ConfigError(
            f"{path}: its last record is cut off (a process stopped while writing it); "
            f"the next one would be written onto it. Cut it off with: truncate -s {whole} {path}"
        )


def open_study(space: Space, settings: Settings) -> Any:
    """The sweep's study in runs/.sweeps/<name>/optuna.journal (made on first use, checked)."""
    optuna = _optuna()
    from optuna.storages.journal import JournalFileBackend  # noqa: PLC0415

    folder = sweep_dir(space, settings)
    folder.mkdir(parents=True, exist_ok=True)
    journal = folder / "optuna.journal"
    check_journal(journal)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=space.prune_after)
        if space.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    try:
        # The journal is an append-only file with a lock file beside it: it works on NFS and
        # Lustre, where SQLite's locking does not, and needs no server. Optuna replays it
        # here, whole.
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
        return optuna.create_study(
            study_name=space.name,
            storage=storage,
            direction="minimize" if space.direction == "min" else "maximize",
            sampler=optuna.samplers.TPESampler(seed=space.seed),
            pruner=pruner,
            load_if_exists=True,
        )
    except Exception as err:  # records that parse but do not replay: any error is the file's
        why = " ".join(f"{type(err).__name__}: {err}".split())
        raise ConfigError(
            f"{journal}: Optuna cannot replay it ({why}; the file is damaged): restore it "
            "from a copy, or start the sweep again under another sweep.name"
        ) from err


def _ends(space: Space) -> list[dict[str, searchspace.Scalar]]:
    """The corners of the space: checking them checks every point Optuna may pick."""
    corners = []
    for pick in (min, max):
        corner: dict[str, searchspace.Scalar] = {}
        for dim in space.dimensions:
            if dim.form in {"list", "range"}:
                corner[dim.key] = pick(
                    dim.values, key=lambda v: v if isinstance(v, int | float) else 0
                )
            else:
                bound = pick(dim.low, dim.high)
                corner[dim.key] = int(bound) if dim.form == "int" else float(bound)
        corners.append(corner)
    return corners


def _start_study(
    space: Space, extra: list[str], config: Path | None, settings: Settings, dry_run: bool
) -> int:
    task_dir = settings.project_root / "configs" / "tasks"
    checks = [*_ends(space), *space.enqueue]
    for dim in space.dimensions:  # every value of a list, not only the extremes
        checks += [{**checks[0], dim.key: value} for value in dim.values]
    searchspace.check_runs(
        space,
        [searchspace.overrides(space, p, f"{space.name}-000", extra) for p in checks],
        _checked_config(config, settings),
        task_dir,
    )
    copy = sweep_dir(space, settings) / "sweep.toml"
    text = space.path.read_text(encoding="utf-8")
    config_arg = [f"--config={config}"] if config else []

    def job_args(tasks: int) -> list[str]:
        variable = f"SWEEP_SPACE={_shown(copy, settings.project_root)}"
        return [_array(tasks, space), f"--export=ALL,{variable}", JOB_SCRIPT, *config_arg, *extra]

    if dry_run:
        print(f"dry run: optuna study {space.name}, {space.trials} trials, journal {copy.parent}")
        _submit(job_args(space.trials), settings.project_root, dry_run)
        return 0
    _optuna()  # the extra is installed: before anything is written
    _need_sbatch()
    if copy.is_file():  # a sweep continued: more trials or another pace, the same study
        before = dataclasses.asdict(searchspace.load_space(copy))
        now = dataclasses.asdict(space)
        if any(before[k] != now[k] for k in now if k not in {"path", "trials", "concurrency"}):
            raise ConfigError(
                f"sweep.name {space.name!r}: {copy} holds another search space (only trials "
                "and concurrency may change); give the sweep a new name"
            )
    study = open_study(space, settings)  # checks the journal first: nothing written yet
    _write_whole(copy, text)
    states = _optuna().trial.TrialState
    if not study.trials:
        for point in space.enqueue:
            study.enqueue_trial(dict(point))  # parameter names: the dotted keys
    finished = len(study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED)))
    left = space.trials - finished
    if left <= 0:
        print(f"study {space.name}: {finished} trials finished of {space.trials}: nothing to do")
        return 0
    job = _submit(job_args(left), settings.project_root, dry_run)
    print(
        f"submitted array job {job}: {left} trials of study {space.name} "
        f"({finished} finished before), at most {space.concurrency} at a time"
    )
    return 0


def _suggest(trial: Any, space: Space) -> dict[str, searchspace.Scalar]:
    """The trial's settings: drawn now, or the ones drawn before (a resumed trial)."""
    point: dict[str, searchspace.Scalar] = {}
    for dim in space.dimensions:
        name = dim.key
        if dim.form in {"list", "range"}:
            point[dim.key] = trial.suggest_categorical(name, dim.values)
        elif dim.form == "int":
            point[dim.key] = trial.suggest_int(name, int(dim.low), int(dim.high))
        else:
            log = dim.form == "log_uniform"
            point[dim.key] = trial.suggest_float(name, dim.low, dim.high, log=log)
    return point


def _claim(
    study: Any, space: Space, env: Mapping[str, str], folder: Path
) -> tuple[Any, dict[str, searchspace.Scalar]] | None:
    """This array task's trial and its settings (None: every trial finished or taken).

    The task's own trial (it was requeued), else a running trial of an earlier array (the
    sweep was cancelled), else a new one.
    """
    optuna = _optuna()
    from optuna.storages.journal import JournalFileOpenLock  # noqa: PLC0415

    array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if not (array_job and task):
        raise ConfigError("sweep --trial: not a Slurm array task (submit with `sweep`)")
    me = f"{array_job}_{task}"
    states = optuna.trial.TrialState
    # Every rank of a multi-process trial claims: the lock makes the first one claim and draw
    # the settings, and the others find its claim (the same key) and read them, so they
    # train the same trial. (A lock file left by a killed process is taken over after 30 s.)
    lock = JournalFileOpenLock(str(folder / "claim.lock"))
    lock.acquire()
    try:
        running = study.get_trials(deepcopy=False, states=(states.RUNNING,))
        mine = [t for t in running if t.user_attrs.get("slurm_task") == me]
        # A running trial of an earlier array (cancelled, timed out) is continued here.
        orphans = [t for t in running if t.user_attrs.get("array_job") != array_job]
        finished = study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED))
        if mine or orphans:
            trial = optuna.trial.Trial(study, (mine or orphans)[0]._trial_id)
        elif len(finished) + len(running) < space.trials:
            # Each task has a sampler of its own: seeded alike, they would all draw the same
            # point. The trial count makes the seed differ per trial, and a sweep whose
            # trials run one after the other repeat its draws.
            study.sampler = optuna.samplers.TPESampler(seed=space.seed + len(study.trials))
            trial = study.ask()
        else:
            return None
        trial.set_user_attr("slurm_task", me)
        trial.set_user_attr("array_job", array_job)
        return trial, _suggest(trial, space)
    finally:
        lock.release()


class TrialListener:
    """Reports each validation of the run to its trial; tells the study how the run ended."""

    def __init__(self, study: Any, trial: Any, space: Space) -> None:
        """Listen for `trial` of `study`, on `space.metric`."""
        self.study, self.trial, self.space = study, trial, space

    def validated(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Report the metric at `step`; True when the pruner stops the trial."""
        value = metrics.get(self.space.metric, math.nan)
        if not math.isfinite(value):
            return False
        self.trial.report(value, step)
        return self.space.pruner != "none" and bool(self.trial.should_prune())

    def ended(self, summary: Mapping[str, Any]) -> None:
        """Tell the study how the trial ended (a status it does not know: still running).

        finished: the metric's last value; pruned; diverged or data-failed: failed.
        """
        states = _optuna().trial.TrialState
        status = summary["status"]
        if status == "finished":
            self.study.tell(self.trial.number, summary[f"val_{self.space.metric}"])
        elif status in {"pruned", "diverged", "data-failed"}:
            state = states.PRUNED if status == "pruned" else states.FAIL
            self.study.tell(self.trial.number, state=state)


def start_trial(
    space_path: Path, extra: list[str], settings: Settings, env: Mapping[str, str]
) -> tuple[list[str], TrialListener] | None:
    """In an array task: claim a trial; its run's settings and listener (None: none left)."""
    space = searchspace.load_space(space_path)
    if space.method != "optuna":
        raise ConfigError(f"{space_path}: sweep --trial needs sweep.method = 'optuna'")
    study = open_study(space, settings)
    claimed = _claim(study, space, env, sweep_dir(space, settings))
    if claimed is None:
        print(f"study {space.name}: every trial is finished or taken: nothing to do")
        return None
    trial, point = claimed
    run = searchspace.run_name(space.name, trial.number, space.trials)
    print(f"study {space.name}: trial {trial.number} -> run {run}: {point}", flush=True)
    return searchspace.overrides(space, point, run, extra), TrialListener(study, trial, space)
