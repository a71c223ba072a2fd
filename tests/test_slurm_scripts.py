"""The generated Slurm scripts without a cluster: lint, header rules, values kept in sync.

`bash -n` and shellcheck run on every script for a covering set of answers (every environment,
every preset, account and mail on and off, one and two nodes). The rest checks rules that Slurm
or the trainer would only reveal at run time.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from engines import BIN, ROOT, bake

PRESETS = sorted(p.stem for p in (ROOT / "presets").glob("*.toml"))
ENVIRONMENTS = ("venv", "conda", "apptainer", "uv")
EXTRAS = (
    {},
    {"account": "proj-01", "mail": "jane.doe@example.org", "nodes": "2"},
    {"gpus_per_node": "4", "time_limit": "45"},
)
CASES = [
    {"cluster": preset, "environment": env, **EXTRAS[i % len(EXTRAS)]}
    for i, (preset, env) in enumerate(itertools.product(PRESETS, ENVIRONMENTS))
]


def _rules():
    spec = importlib.util.spec_from_file_location("rules", ROOT / "hooks/pre_gen_project.py")
    assert spec and spec.loader
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    return rules


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c.values()))
def baked(request, template: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    result = bake("cookiecutter", template, tmp_path_factory.mktemp("scripts"), request.param)
    assert result.ok, result.stderr
    return result.project, request.param


def scripts(project: Path) -> list[Path]:
    return sorted(p for p in (project / "slurm").iterdir() if p.suffix in {".sh", ".sbatch"})


def test_shell_scripts_pass_bash_n_and_shellcheck(baked) -> None:
    project, _ = baked
    found = scripts(project)
    assert {p.name for p in found} == {
        "chain.sh",
        "common.sh",
        "interactive.sh",
        "monitor.sh",
        "sweep.sbatch",
        "train.sbatch",
    }
    for script in found:
        res = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert res.returncode == 0, f"{script.name}: {res.stderr}"
    res = subprocess.run(
        [str(BIN / "shellcheck"), "-x", *(str(p.relative_to(project)) for p in found)],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout
    for script in found:  # run directly, except the sourced library
        assert (script.stat().st_mode & 0o111 != 0) == (script.name != "common.sh"), script.name


def sbatch_header(script: Path) -> list[str]:
    """The #SBATCH lines, after checking they all come before the first command."""
    lines = script.read_text().splitlines()
    first_command = next(
        i for i, ln in enumerate(lines) if i > 0 and ln.strip() and not ln.startswith("#")
    )
    assert not [ln for ln in lines[first_command:] if ln.startswith("#SBATCH")], script.name
    return [ln for ln in lines[:first_command] if ln.startswith("#SBATCH")]


def test_sbatch_headers_are_literal_and_match_the_answers(baked) -> None:
    project, answers = baked
    train = sbatch_header(project / "slurm" / "train.sbatch")
    sweep = sbatch_header(project / "slurm" / "sweep.sbatch")
    for line in train + sweep:  # Slurm does not expand anything in #SBATCH lines
        assert not re.search(r"[$`~\\\"']", line), line
    options = dict(ln.removeprefix("#SBATCH ").partition("=")[::2] for ln in train)
    assert options["--nodes"] == answers.get("nodes", "1")
    assert options["--ntasks-per-node"] == answers.get("gpus_per_node", "1")
    assert ("--account" in options) == bool(answers.get("account"))
    assert ("--mail-user" in options) == bool(answers.get("mail"))
    assert {"--requeue", "--open-mode"} <= options.keys()
    # The stop signal follows the job's actual limit (schedule_stop in common.sh), not a
    # lead fixed here that a shorter --time at submit would turn into a requeue loop.
    assert "--signal" not in options
    assert options["--output"] == "logs/%x-%j.out"
    # The sweep asks for the same resources; only its name, array and log name differ.
    differ = ("--job-name", "--array", "--output")
    assert [ln for ln in train if not ln.startswith(differ, 8)] == [
        ln for ln in sweep if not ln.startswith(differ, 8)
    ]
    assert "--output=logs/%x-%A_%a.out" in " ".join(sweep)


def test_sweep_array_matches_the_parameter_file(baked) -> None:
    project, _ = baked
    lines = [
        ln
        for ln in (project / "slurm" / "sweep_params.txt").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    header = " ".join(sbatch_header(project / "slurm" / "sweep.sbatch"))
    assert f"--array=0-{len(lines) - 1}%" in header


TIME_LIMITS = ["5", "30:00", "90", "2:00:00", "12:00:00", "1-00", "1-6:30", "2-00:00:00"]


@pytest.mark.parametrize("time_limit", TIME_LIMITS)
def test_time_limit_derived_values(template: Path, tmp_path: Path, time_limit: str) -> None:
    """The header keeps the limit as answered (the stop signal is timed in the job)."""
    result = bake("cookiecutter", template, tmp_path, {"time_limit": time_limit})
    assert result.ok, result.stderr
    assert _rules().parse_time(time_limit)
    for name in ("train.sbatch", "sweep.sbatch"):
        assert f"#SBATCH --time={time_limit}" in sbatch_header(result.project / "slurm" / name)


def _run_common_sh(
    project: Path, code: str, path: str = "/usr/bin:/bin", **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `code` after sourcing the generated slurm/common.sh, with only PATH and `env` set."""
    return subprocess.run(
        ["bash", "-c", f"source slurm/common.sh; trap - EXIT; {code}"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": path, **env},
    )


def _common_sh(project: Path, code: str) -> list[str]:
    """Words printed by `code` run after sourcing the generated slurm/common.sh."""
    res = _run_common_sh(project, code)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


# squeue's time left (%L) -> seconds; the words Slurm prints for no limit give none.
SQUEUE_TIMES = {"0:59": 59, "2:00": 120, "1:02:03": 3723, "1-00:00:00": 86400, "2-3:04:05": 183845}


def test_time_left_is_read_as_squeue_prints_it(default_bake) -> None:
    words = " ".join(SQUEUE_TIMES)
    out = _common_sh(default_bake.project, f"for t in {words}; do seconds_of $t; done")
    assert [int(v) for v in out] == list(SQUEUE_TIMES.values())
    for word in ("UNLIMITED", "NOT_SET", "INVALID", ""):
        assert _common_sh(default_bake.project, f"seconds_of '{word}' || echo none") == ["none"]


# squeue's "%l %L" (limit, time left) at a segment's start -> (exit status, what the log says).
STOP_CASES = {
    # A segment starts a few seconds into its limit: the limit decides, so --time=3 that
    # passed on the first start also passes on the requeued one (it once failed at 178 s).
    "3:00 2:58": (0, "time left 178 s: USR1 to stop in 118 s, 60 s before the limit"),
    "1:00:00 59:30": (0, "time left 3570 s: USR1 to stop in 3270 s, 300 s before the limit"),
    "2:00 2:00": (2, "the time limit of 120 s leaves 60 s of training"),
    "UNLIMITED UNLIMITED": (0, "no time limit found for job 7: no stop signal scheduled"),
}


@pytest.mark.parametrize(("times", "expected"), STOP_CASES.items())
def test_stop_signal_is_decided_by_the_limit_and_timed_by_the_time_left(
    default_bake, tmp_path: Path, times: str, expected: tuple[int, str]
) -> None:
    fake = tmp_path / "squeue"
    fake.write_text(f"#!/bin/sh\necho '{times}'\n")
    fake.chmod(0o755)
    code = 'schedule_stop; [[ -z ${TIMER_PID:-} ]] || kill "$TIMER_PID"'  # no timer left behind
    res = _run_common_sh(default_bake.project, code, f"{tmp_path}:/usr/bin:/bin", SLURM_JOB_ID="7")
    status, line = expected
    assert (res.returncode, line in res.stdout) == (status, True), res.stdout + res.stderr


def test_modules_load_from_a_clean_state(default_bake) -> None:
    # A stand-in for the cluster's `module` function records what the job asks of it:
    # modules loaded at login (a cuda module) are purged before the preset's are loaded.
    out = _common_sh(default_bake.project, 'module() { echo "module:$*"; }; load_modules a b/1')
    assert out[:4] == ["module:purge", "module:load", "a", "b/1"]


def test_rendezvous_port_is_the_same_in_the_script_and_in_python(default_bake) -> None:
    project = default_bake.project
    spec = importlib.util.spec_from_file_location(
        "dist", project / "src" / project.name / "distributed.py"
    )
    assert spec and spec.loader
    dist = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dist)
    cases = [(8, 0), (9, 0), (1234567, 3), (4001, 7)]
    for job, restart in cases:
        env = f"SLURM_JOB_ID={job} SLURM_RESTART_COUNT={restart}"
        srun, torchrun = _common_sh(
            project, f"{env} rendezvous_port srun; {env} rendezvous_port torchrun"
        )
        assert int(srun) == dist.rendezvous_port(job, restart)
        assert int(torchrun) not in {dist.rendezvous_port(job, r) for r in range(5)}


GRETE = tomllib.loads((ROOT / "presets" / "grete.toml").read_text())["partitions"]


@pytest.mark.parametrize(
    ("answers", "request_line", "mem"),
    [
        *[
            ({"partition": name}, f"--gpus-per-node={spec['gpu_type']}:1", "64G")
            for name, spec in GRETE.items()
        ],
        ({"partition": "kisski-h100,grete-h100"}, "--gpus-per-node=H100:1", "64G"),
        ({"partition": "scc-gpu", "gpu_type": "V100"}, "--gpus-per-node=V100:1", "64G"),
        ({"partition": "grete", "gpus_per_node": "4"}, "--gpus-per-node=A100:4", "256G"),
        ({"memory": "500M/gpu", "gpus_per_node": "2"}, "--gpus-per-node=A100:2", "1000M"),
        ({"memory": "100G"}, "--gpus-per-node=A100:1", "100G"),
        ({"cluster": "generic"}, "--gres=gpu:1", "32G"),
        ({"cluster": "generic", "gpu_type": "a100"}, "--gres=gpu:a100:1", "32G"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v.values()),
)
def test_gpu_request_and_memory_follow_partition_and_answers(
    template: Path, tmp_path: Path, answers: dict[str, str], request_line: str, mem: str
) -> None:
    result = bake("cookiecutter", template, tmp_path, answers)
    assert result.ok, result.stderr
    for name in ("train.sbatch", "sweep.sbatch"):
        header = sbatch_header(result.project / "slurm" / name)
        assert f"#SBATCH {request_line}" in header
        assert f"#SBATCH --mem={mem}" in header


def test_requeue_exit_code_matches_the_trainer(baked) -> None:
    project, _ = baked
    common = (project / "slurm" / "common.sh").read_text()
    preemption = (project / "src" / project.name / "preemption.py").read_text()
    script_code = re.search(r"^readonly EXIT_REQUEUE=(\d+)$", common, re.MULTILINE)
    trainer_code = re.search(r"^EXIT_REQUEUE = (\d+)$", preemption, re.MULTILINE)
    assert script_code and trainer_code
    assert script_code[1] == trainer_code[1]


def test_values_in_shell_code_are_quoted(baked) -> None:
    project, answers = baked
    preset = tomllib.loads((ROOT / "presets" / f"{answers['cluster']}.toml").read_text())
    text = (project / "slurm" / "interactive.sh").read_text()
    assert f"--partition='{preset['interactive_partition']}'" in text
    assert f"    '{preset['interactive_gpu_request']}'" in text
    memory = answers.get("memory", preset["default_memory"]).removesuffix("/gpu")
    assert f"--mem='{memory}'" in text  # one GPU: per node and per GPU agree
    if answers.get("account"):
        assert f"--account='{answers['account']}'" in text
    common = (project / "slurm" / "common.sh").read_text()
    if answers["environment"] in {"venv", "conda", "uv"}:
        wanted = " ".join(f"'{m}'" for m in preset["modules"])
        assert f"load_modules {wanted}".rstrip() in common


@pytest.mark.parametrize(
    ("args", "message"),
    [((), "usage"), (("x",), "usage"), (("0",), "usage"), (("2", "run.name=a,b"), "run name")],
)
def test_chain_rejects_bad_arguments(default_bake, args, message) -> None:
    res = subprocess.run(
        ["bash", "slurm/chain.sh", *args],
        cwd=default_bake.project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_readme_shows_the_scripts_commands(baked) -> None:
    project, _ = baked
    readme = (project / "slurm" / "README.md").read_text()
    header = (project / "slurm" / "train.sbatch").read_text().splitlines()
    cpu_only = next(ln for ln in header if "without a GPU" in ln).split(":", 1)[1].strip()
    assert f"`{cpu_only}`" in readme
    for script in scripts(project):
        if script.name != "common.sh":
            assert f"slurm/{script.name}" in readme, script.name
