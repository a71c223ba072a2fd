"""Command line: prepare, train, evaluate, export, compare, plan, doctor, data, sweep.

Heavy modules (torch, matplotlib) are imported inside the commands, so `--help` is instant.
Every command takes `--config FILE` (default `configs/train.toml`) and `section.key=value`
overrides, e.g. `train train.epochs=3 run.name=try1`.
Exit codes: 0 done, 1 error (one line on stderr, also for a file or folder that cannot be
read or written; an unexpected exception, e.g. in task code or a DataLoader worker, prints its
traceback first), 2 bad usage or configuration, 3 (`train` only) checkpointed after a stop
signal (USR1, TERM or a first Ctrl-C), requeue me; 75 (`train` only) a distributed failure,
worth a relaunch; 130 interrupted (a second Ctrl-C).
"""

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from . import __version__
from .config import Config, field_types
from .data import rawdata, sources
from .data.manifest import RawDataError
from .engine.names import check_given, check_run_name
from .errors import ConfigError, DataError, ProjectError, crash_line, first_line
from .settings import Settings, get_settings

PROG = __package__ or "main"


def _config(args: argparse.Namespace, settings: Settings) -> Config:
    configs = settings.project_root / "configs"
    path = args.config
    if path is None:
        default = configs / "train.toml"
        path = default if default.is_file() else None
    from .task import load_config  # noqa: PLC0415  (types the task's settings: imports torch)

    return load_config(path, args.overrides, task_dir=configs / "tasks")


def _verify_raw(cfg: Config, settings: Settings) -> None:
    if cfg.data.verify_raw:
        rawdata.verify_raw(settings.raw_dir, settings.project_root / rawdata.MANIFEST_PATH)


def _limit_threads() -> str:
    """The one thread rule of every command that computes (engine.parallel.runtime.cpu_share)."""
    from .engine.parallel import distributed, runtime  # noqa: PLC0415  (imports torch)

    runtime.limit_threads(distributed.resolve_env())
    return runtime.threads_note()


def cmd_prepare(args: argparse.Namespace) -> int:
    """Raw data -> the task's processed data (all or nothing)."""
    settings = get_settings()
    cfg = _config(args, settings)
    _verify_raw(cfg, settings)
    from .data.processed import prepare  # noqa: PLC0415  (imports torch)
    from .task import load_task  # noqa: PLC0415

    threads = _limit_threads()
    task = load_task(cfg, settings)
    print(prepare(task))
    print(f"wrote {task.processed_dir} ({threads})")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train or resume; exit 3 after a stop signal (checkpoint written)."""
    settings = get_settings()
    cfg = _config(args, settings)
    check_given(cfg.run.name, os.environ.get("RUN_NAME", ""))  # before any file is touched
    from .engine.loop.trainer import run_name, train  # noqa: PLC0415
    from .observe import diagnostics  # noqa: PLC0415  (imports torch)

    name = run_name(cfg, os.environ)
    if not (cfg.run.name or os.environ.get("RUN_NAME") or os.environ.get("SLURM_JOB_ID")):
        cfg.run.name = name  # a timestamp, taken once: the diagnostics use the trainer's folder
    try:
        with diagnostics.session(settings.runs_dir / name, cfg.run.debug, cfg.run.profile_steps):
            result = train(cfg, settings=settings, check_raw=lambda: _verify_raw(cfg, settings))
    except DataError as err:
        if "run `prepare`" not in str(err) or (settings.processed_dir / cfg.task.name).is_dir():
            raise  # a stream, a sample that cannot be batched: prepare would not help
        # `prepare` alone would prepare the default task: say the command for this one.
        config = [f"--config={args.config}"] if args.config else []
        command = " ".join([PROG, "prepare", *config, *args.overrides])
        raise DataError(f"{err}; for this task and settings: `{command}`") from None
    except Exception as err:  # a full disk: one line naming where; a distributed failure: the
        # one line and the code the job script relaunches on
        if failure := diagnostics.write_failure(err, settings.runs_dir / name):
            raise failure from None
        if not diagnostics.is_transient(err):
            raise
        first = first_line(err)
        print(f"error: {first} (transient: exit {diagnostics.EXIT_TRANSIENT})", file=sys.stderr)
        return diagnostics.EXIT_TRANSIENT
    return result.exit_code


def cmd_evaluate(args: argparse.Namespace) -> int:
    """The task's test-split metrics and figures for a run's latest checkpoint."""
    settings = get_settings()
    from .engine.loop.evaluate import evaluate_run, latest_run  # noqa: PLC0415  (imports torch)

    if args.run:
        check_run_name(args.run, "--run")
        if not (settings.runs_dir / args.run).is_dir():
            saved = settings.runs_dir.glob("*/checkpoints")
            found = sorted(p.parent.name for p in saved if p.is_dir())
            runs = ", ".join(found) if found else "none yet: train first"
            raise DataError(f"--run {args.run}: no such run in {settings.runs_dir}; runs: {runs}")
    run_dir = settings.runs_dir / args.run if args.run else latest_run(settings.runs_dir)
    _limit_threads()
    result = evaluate_run(run_dir, settings, args.device)
    print(json.dumps(result, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A run's final or best weights as a model folder (safetensors, config, tokenizer)."""
    settings = get_settings()
    from .engine.loop.evaluate import latest_run  # noqa: PLC0415  (imports torch)
    from .ops.export import export_run  # noqa: PLC0415

    if args.run:
        check_run_name(args.run, "--run")
    run_dir = settings.runs_dir / args.run if args.run else latest_run(settings.runs_dir)
    default = "adapters" if args.adapters else f"export-{args.module}" if args.module else "export"
    out = args.out or run_dir / default
    _limit_threads()
    export_run(
        run_dir,
        out,
        settings,
        args.weights,
        args.dtype,
        adapters=args.adapters,
        shard_gb=args.shard_gb,
        module=args.module or "",
    )
    weights = sorted(out.glob("*.safetensors"))
    size_mb = sum(path.stat().st_size for path in weights) / 1e6
    what = "LoRA adapters" if args.adapters else f"module {args.module}" if args.module else "model"
    print(f"wrote {out}: {what}, {args.weights} weights, {args.dtype}, {size_mb:.1f} MB")
    print(f"  {', '.join(path.name for path in sorted(out.iterdir()))}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """One table of runs: differing settings, final and best metrics, steps, hours, status."""
    settings = get_settings()
    from .experiments.compare import run_compare  # noqa: PLC0415

    check_run_name(args.name, "--name")  # a file name below reports/, like a run's folder
    runs = run_compare(
        settings.runs_dir,
        settings.project_root / "reports",
        args.runs,
        metric=args.metric,
        mode=args.mode,
        name=args.name,
        figure=not args.no_figure,
        wide=args.wide,
    )
    return 1 if any(run.problem for run in runs) else 0  # a damaged run: said, and exit 1


def cmd_plan(args: argparse.Namespace) -> int:
    """Memory per GPU under ddp and fsdp, checkpoint size and save time, and advice."""
    # Bounds that no cluster exceeds: a typo (1e9 GPUs, inf GB) is one line, not a plan.
    for option, most in (("gpus", 100_000), ("gpu_memory", 10_000.0), ("disk_mb", 10**7)):
        value = getattr(args, option)
        if not 0 <= value <= most:  # also NaN
            flag = "--" + option.replace("_", "-")
            raise ConfigError(f"{flag}: must be between 0 and {most:g}, got {value}")
    settings = get_settings()
    cfg = _config(args, settings)
    from .ops.plan import read_cluster, run_plan  # noqa: PLC0415  (imports torch)

    cluster = read_cluster(settings.project_root / "configs" / "cluster.toml")
    if args.gpus:
        cluster.nodes, cluster.gpus_per_node = 1, args.gpus
    if args.gpu_memory:
        cluster.gpu_gb, cluster.gpu_memory = args.gpu_memory, f"{args.gpu_memory:g}G (--gpu-memory)"
    _limit_threads()
    run_plan(cfg, settings, cluster, args.disk_mb)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Environment report; exit 0 even with warnings (they are advice)."""
    settings = get_settings()
    if args.site:
        from .ops.sitecheck import run_site_check  # noqa: PLC0415

        run_site_check(settings.project_root)
        return 0
    cfg = _config(args, settings)
    from .ops.doctor import run_doctor  # noqa: PLC0415  (imports torch)

    run_doctor(cfg, settings, quick=args.quick)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """A search space -> its runs as one job array (`--trial`: one Optuna trial, in a task)."""
    settings = get_settings()
    from .engine import hooks  # noqa: PLC0415  (the Optuna part imports optuna)
    from .experiments import sweep  # noqa: PLC0415  (the Optuna part imports optuna)

    space, extra = args.space, list(args.overrides)
    if space is not None and "=" in space.name:  # settings only: the default space
        space, extra = None, [str(args.space), *extra]
    space = space or settings.project_root / "configs" / "sweep.toml"
    if not args.trial:
        return sweep.run_sweep(space, extra, args.config, settings, args.dry_run)
    started = sweep.start_trial(space, extra, settings, os.environ)
    if started is None:
        return 0
    overrides, listener = started
    with hooks.listening(listener):
        return cmd_train(argparse.Namespace(config=args.config, overrides=overrides))


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
        ("plan", cmd_plan, "memory per GPU, checkpoint size and save time, before a job"),
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
        if name == "plan":
            command.add_argument(
                "--gpus", type=int, default=0, help="GPUs in all (default: configs/cluster.toml)"
            )
            command.add_argument(
                "--gpu-memory",
                type=float,
                default=0.0,
                help="GB of one GPU (default: the preset's)",
            )
            command.add_argument(
                "--disk-mb",
                type=int,
                default=128,
                help="MB written to measure the run directory's disk (0: skip)",
            )

    evaluate = sub.add_parser(
        "evaluate", help="score a run on the test split", description=cmd_evaluate.__doc__
    )
    evaluate.add_argument("--run", help="run name under runs/ (default: the newest run)")
    evaluate.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"])
    evaluate.set_defaults(func=cmd_evaluate)

    export = sub.add_parser(
        "export", help="write a run's weights as safetensors", description=cmd_export.__doc__
    )
    export.add_argument("--run", help="run name under runs/ (default: the newest run)")
    export.add_argument(
        "--weights",
        default="final",
        choices=["final", "best"],
        help="final: the newest checkpoint; best: best.pt (run.best_metric)",
    )
    export.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    export.add_argument(
        "--out", type=Path, help="output folder (default: runs/<run>/export or .../adapters)"
    )
    export.add_argument(
        "--adapters",
        action="store_true",
        help="a LoRA run's adapters as a peft adapter folder (default: merged into the model)",
    )
    export.add_argument(
        "--shard-gb", type=float, default=5.0, help="largest safetensors file (default: 5)"
    )
    export.add_argument(
        "--module",
        help="only this submodule of the model, e.g. a distillation's student "
        "(default folder: runs/<run>/export-<module>)",
    )
    export.set_defaults(func=cmd_export)

    sweep = sub.add_parser(
        "sweep", help="submit a sweep from a search space", description=cmd_sweep.__doc__
    )
    sweep.add_argument(
        "space", nargs="?", type=Path, help="search space (default: configs/sweep.toml)"
    )
    sweep.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="a setting of every run"
    )
    sweep.add_argument("--config", type=Path, help="TOML config file (default: configs/train.toml)")
    sweep.add_argument("--dry-run", action="store_true", help="print the runs, submit nothing")
    sweep.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)  # the job script's
    sweep.set_defaults(func=cmd_sweep)
    compare = sub.add_parser(
        "compare", help="one table of runs, best first", description=cmd_compare.__doc__
    )
    compare.add_argument(
        "runs", nargs="*", metavar="RUNS", help="run names or globs, e.g. 'lr-*' (default: all)"
    )
    compare.add_argument(
        "--metric", default="", help="validation metric to rank by (default: run.best_metric, loss)"
    )
    compare.add_argument("--mode", default="", choices=["", "min", "max"], help="better is")
    compare.add_argument(
        "--name", default="compare", help="reports/NAME.csv, NAME.md, figures/NAME.png"
    )
    compare.add_argument("--no-figure", action="store_true", help="skip the figure")
    compare.add_argument(
        "--wide",
        action="store_true",
        help="print every column, as reports/NAME.md holds them (default: what fits 100 columns)",
    )
    compare.set_defaults(func=cmd_compare)

    sources.add_source_commands(rawdata.add_data_command(sub))
    return parser


def _setting_hint(unknown: list[str], argv: list[str]) -> str:
    """`--epochs 3` -> `train.epochs=3`: how an unknown option is written as a setting."""
    option = next((arg for arg in unknown if arg.startswith("--")), "--epochs")
    name, _, value = option[2:].partition("=")
    following = argv[argv.index(option) + 1 :] if option in argv else []
    if not value and following and not following[0].startswith("-"):
        value = following[0]
    key = name.replace("-", "_")
    sections = [name for name, kind in field_types(Config).items() if key in field_types(kind)]
    dotted = key if "." in key else f"{sections[0] if sections else 'section'}.{key}"
    return f"{dotted}={value or '...'}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and `python -m`; returns the exit code."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)}; settings are section.key=value,"
            f" e.g. `{PROG} {args.command} {_setting_hint(unknown, argv)}`"
        )
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
    except KeyboardInterrupt:  # a second Ctrl-C during `train`, or one outside it
        print(
            "error: interrupted by Ctrl-C (train: nothing saved after the last checkpoint)",
            file=sys.stderr,
        )
        return 130  # the shell's code for a process ended by SIGINT
    except Exception as err:  # a bug in task code, a bad sample: the traceback, then one line
        traceback.print_exc()
        print(f"error: {crash_line(err, dict(os.environ))}", file=sys.stderr, flush=True)
        return 1
