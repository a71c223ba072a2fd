"""Command line: `<package> prepare | train | evaluate | doctor | data`.

Heavy modules (torch, matplotlib) are imported inside the commands, so `--help` is instant.
Every command takes `--config FILE` (default `configs/train.toml`) and `section.key=value`
overrides, e.g. `train train.epochs=3 run.name=try1`.
Exit codes: 0 done, 1 error (one line on stderr, also for a file or folder that cannot be
read or written), 2 bad usage or configuration, 3 (`train` only) checkpointed after a stop
signal, requeue me; 75 (`train` only) a distributed failure, worth a relaunch.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__, rawdata
from .config import Config, load_config
from .errors import ConfigError, ProjectError
from .manifest import RawDataError
from .names import check_given, check_run_name
from .settings import Settings, get_settings

PROG = __package__ or "main"


def _config(args: argparse.Namespace, settings: Settings) -> Config:
    configs = settings.project_root / "configs"
    path = args.config
    if path is None:
        default = configs / "train.toml"
        path = default if default.is_file() else None
    try:
        return load_config(path, args.overrides, task_dir=configs / "tasks")
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        reason = "not UTF-8 text" if isinstance(err, UnicodeDecodeError) else err.strerror
        raise ConfigError(f"--config {path}: cannot be read: {reason}") from None


def _verify_raw(cfg: Config, settings: Settings) -> None:
    if cfg.data.verify_raw:
        rawdata.verify_raw(settings.raw_dir, settings.project_root / rawdata.MANIFEST_PATH)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Raw data -> the task's processed data (all or nothing)."""
    settings = get_settings()
    cfg = _config(args, settings)
    _verify_raw(cfg, settings)
    from .data import prepare  # noqa: PLC0415  (imports torch)
    from .task import load_task  # noqa: PLC0415

    task = load_task(cfg, settings)
    print(prepare(task))
    print(f"wrote {task.processed_dir}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train or resume; exit 3 after a stop signal (checkpoint written)."""
    settings = get_settings()
    cfg = _config(args, settings)
    check_given(cfg.run.name, os.environ.get("RUN_NAME", ""))  # before any file is touched
    from . import diagnostics  # noqa: PLC0415  (imports torch)
    from .trainer import run_name, train  # noqa: PLC0415

    name = run_name(cfg, os.environ)
    if not (cfg.run.name or os.environ.get("RUN_NAME") or os.environ.get("SLURM_JOB_ID")):
        cfg.run.name = name  # a timestamp, taken once: the diagnostics use the trainer's folder
    try:
        with diagnostics.session(settings.runs_dir / name, cfg.run.debug, cfg.run.profile_steps):
            result = train(cfg, settings=settings, check_raw=lambda: _verify_raw(cfg, settings))
    except Exception as err:  # a full disk: one line naming where; a distributed failure: the
        # one line and the code the job script relaunches on
        if failure := diagnostics.write_failure(err, settings.runs_dir / name):
            raise failure from None
        if not diagnostics.is_transient(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {first} (transient: exit {diagnostics.EXIT_TRANSIENT})", file=sys.stderr)
        return diagnostics.EXIT_TRANSIENT
    return result.exit_code


def cmd_evaluate(args: argparse.Namespace) -> int:
    """The task's test-split metrics and figures for a run's latest checkpoint."""
    settings = get_settings()
    from .evaluate import evaluate_run, latest_run  # noqa: PLC0415  (imports torch)

    if args.run:
        check_run_name(args.run, "--run")
    run_dir = settings.runs_dir / args.run if args.run else latest_run(settings.runs_dir)
    result = evaluate_run(run_dir, settings, args.device)
    print(json.dumps(result, indent=2))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Environment report; exit 0 even with warnings (they are advice)."""
    settings = get_settings()
    if args.site:
        from .sitecheck import run_site_check  # noqa: PLC0415

        run_site_check(settings.project_root)
        return 0
    cfg = _config(args, settings)
    from .doctor import run_doctor  # noqa: PLC0415  (imports torch)

    run_doctor(cfg, settings, quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with all subcommands."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    configured = argparse.ArgumentParser(add_help=False)
    configured.add_argument(
        "--config", type=Path, default=None, help="TOML config file (default: configs/train.toml)"
    )
    configured.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="override a config value, e.g. train.epochs=5",
    )

    commands = [
        ("prepare", cmd_prepare, "turn data/raw into data/processed (seeded splits)"),
        ("train", cmd_train, "train or resume the run (exit 3: checkpointed, requeue)"),
        ("doctor", cmd_doctor, "check the environment and flag common mistakes"),
    ]
    for name, func, text in commands:
        command = sub.add_parser(name, parents=[configured], help=text, description=text)
        command.set_defaults(func=func)
        if name == "doctor":
            command.add_argument("--quick", action="store_true", help="skip the speed tests")
            command.add_argument(
                "--site",
                action="store_true",
                help="compare the cluster preset (configs/cluster.toml) with sinfo and scontrol",
            )

    evaluate = sub.add_parser(
        "evaluate", help="score a run on the test split", description=cmd_evaluate.__doc__
    )
    evaluate.add_argument("--run", help="run name under runs/ (default: the newest run)")
    evaluate.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"])
    evaluate.set_defaults(func=cmd_evaluate)

    rawdata.add_data_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and `python -m`; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (ProjectError, RawDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except OSError as err:  # a path that cannot be read or written: one line, not a traceback
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
