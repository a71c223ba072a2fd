"""The generated Slurm scripts without a cluster: lint, header rules, values kept in sync.

`bash -n` and shellcheck run on every script for a covering set of answers (every environment,
every preset, account and mail on and off, one and two nodes). The rest checks rules that Slurm
or the trainer would only reveal at run time.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from engines import BIN, ROOT, bake, module_at, rules
from envcases import HANG_S

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
        "pack.sbatch",
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
    # The packed job: one task on one GPU of the same kind, whatever the GPUs per node.
    pack = sbatch_header(project / "slurm" / "pack.sbatch")
    packed = dict(ln.removeprefix("#SBATCH ").partition("=")[::2] for ln in pack)
    assert not [ln for ln in pack if re.search(r"[$`~\\\"']", ln)]
    assert (packed["--nodes"], packed["--ntasks"]) == ("1", "1")
    gpu_option = next(k for k in options if k.startswith("--g"))
    assert packed[gpu_option] == re.sub(r"\d+$", "1", options[gpu_option])
    assert packed["--cpus-per-task"] == options["--cpus-per-task"]
    assert {"--requeue", "--open-mode"} <= packed.keys() and "--signal" not in packed


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
    assert rules.parse_time(time_limit)
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
    dist = module_at(project / "src" / project.name / "engine/parallel/distributed.py", "dist")
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
    preemption = (project / "src" / project.name / "engine/parallel/preemption.py").read_text()
    script_code = re.search(r"^readonly EXIT_REQUEUE=(\d+)$", common, re.MULTILINE)
    trainer_code = re.search(r"^EXIT_REQUEUE = (\d+)$", preemption, re.MULTILINE)
    assert script_code and trainer_code
    assert script_code[1] == trainer_code[1]


def test_transient_exit_code_matches_the_trainer(default_bake) -> None:
    project = default_bake.project
    common = (project / "slurm" / "common.sh").read_text()
    diagnostics = (project / "src" / project.name / "observe/diagnostics.py").read_text()
    script_codes = re.search(r'^readonly TRANSIENT_EXITS=" ([\d ]+) "$', common, re.MULTILINE)
    trainer_code = re.search(r"^EXIT_TRANSIENT = (\d+)$", diagnostics, re.MULTILINE)
    assert script_codes and trainer_code
    assert trainer_code[1] in script_codes[1].split()


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


@pytest.mark.parametrize("size", ["0", "65", "2x", str(2**64 + 2)])  # the last wrapped to 2
def test_pack_size_out_of_range_is_refused(default_bake, size: str) -> None:
    res = subprocess.run(
        ["bash", "slurm/pack.sbatch"],
        cwd=default_bake.project,
        env={**os.environ, "PACK_SIZE": size},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"PACK_SIZE={size}: give the number of runs per GPU, 1 to 64" in res.stdout + res.stderr


def test_readme_shows_the_scripts_commands(baked) -> None:
    project, _ = baked
    readme = (project / "slurm" / "README.md").read_text()
    header = (project / "slurm" / "train.sbatch").read_text().splitlines()
    cpu_only = next(ln for ln in header if "without a GPU" in ln).split(":", 1)[1].strip()
    assert f"`{cpu_only}`" in readme
    for script in scripts(project):
        if script.name != "common.sh":
            assert f"slurm/{script.name}" in readme, script.name


def _stand_in(directory: Path, name: str, body: str) -> None:
    """A stand-in for a Slurm command: a bash script `name` in `directory`."""
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(f"#!/bin/bash\n{body}\n")
    (directory / name).chmod(0o755)


@pytest.mark.parametrize(
    ("env", "record", "expected"),
    [
        ({"STOP_GRACE": "900"}, None, (0, "USR1 to stop in 2670 s, 900 s before the limit (STOP")),
        # An earlier stop of this run took 200 s: the next segment waits twice that plus 30 s.
        ({}, "200", (0, "USR1 to stop in 3140 s, 430 s before the limit (twice the 200 s")),
        ({}, "10", (0, "USR1 to stop in 3270 s, 300 s before the limit (a tenth")),
        ({"STOP_GRACE": "5m"}, None, (2, "STOP_GRACE=5m: give whole seconds")),
        # A grace that leaves too little of a one-hour limit is refused like a short limit.
        ({"STOP_GRACE": "3500"}, None, (2, "leaves 100 s of training")),
    ],
)
def test_stop_grace_is_a_setting_and_grows_with_a_slow_stop(
    default_bake, tmp_path: Path, env: dict[str, str], record: str | None, expected
) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "squeue", "echo '1:00:00 59:30'")
    project = _mini_project(default_bake.project, tmp_path)
    if record:
        (project / "logs" / ".stop-seconds-runA").write_text(record)
    code = 'RUN_KEY=runA; schedule_stop; [[ -z ${TIMER_PID:-} ]] || kill "$TIMER_PID"'
    res = _run_common_sh(project, code, f"{bin_dir}:/usr/bin:/bin", SLURM_JOB_ID="7", **env)
    status, line = expected
    assert (res.returncode, line in res.stdout + res.stderr) == (status, True), (
        res.stdout + res.stderr
    )


@pytest.mark.parametrize(
    "case",
    [
        # squeue does not answer: scontrol's limit and run time give the moment.
        (
            "exit 1",
            "echo 'JobId=7 TimeLimit=02:00:00 RunTime=00:10:00 JobState=RUNNING'",
            {},
            "time left 6600 s: USR1 to stop in 6300 s",
        ),
        # Neither answers: newer Slurm's job start and end in the environment.
        (
            "exit 1",
            "exit 1",
            {"SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": "4600"},
            "scontrol gave no time limit; SLURM_JOB_END_TIME did",
        ),
        ("exit 1", "exit 1", {}, "no time limit found for job 7: no stop signal scheduled"),
    ],
)
def test_stop_signal_needs_no_squeue(
    default_bake, tmp_path: Path, case: tuple[str, str, dict[str, str], str]
) -> None:
    squeue, scontrol, env, expected = case
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "squeue", squeue)
    _stand_in(bin_dir, "scontrol", scontrol)
    _stand_in(bin_dir, "sleep", "exit 0")  # squeue's second try comes at once here
    code = 'schedule_stop; [[ -z ${TIMER_PID:-} ]] || kill "$TIMER_PID"'
    res = _run_common_sh(
        default_bake.project, code, f"{bin_dir}:/usr/bin:/bin", SLURM_JOB_ID="7", **env
    )
    assert res.returncode == 0 and expected in res.stdout + res.stderr, res.stdout + res.stderr
    if "END_TIME" in expected:
        assert "USR1 to stop in" in res.stdout


def _mini_project(project: Path, tmp_path: Path) -> Path:
    """A folder with the bake's slurm/common.sh and logs/, for jobs that write their records."""
    mini = tmp_path / "project"
    (mini / "slurm").mkdir(parents=True)
    (mini / "logs").mkdir()
    (mini / "slurm" / "common.sh").write_text((project / "slurm" / "common.sh").read_text())
    return mini


# Stands in for `srun python -m PKG train`: each launch takes the next line of $STATE/codes;
# "stop" waits for USR1, tells the test, waits until the test releases it (a slow checkpoint),
# then exits with the requeue code.
FAKE_STEP = """
trap 'touch "$STATE/usr1"' USR1
trap 'touch "$STATE/term"' TERM
n=$(($(cat "$STATE/launches" 2>/dev/null || echo 0) + 1))
echo "$n" > "$STATE/launches"
code=$(sed -n "${n}p" "$STATE/codes")
touch "$STATE/started-$n"
if [[ "$code" == stop ]]; then
    until [[ -e "$STATE/usr1" ]]; do sleep 0.05; done
    touch "$STATE/saving"
    until [[ -e "$STATE/release" ]]; do sleep 0.05; done
    exit 3
fi
exit "$code"
"""


def _training_job(
    project: Path,
    tmp_path: Path,
    codes: list[str],
    job_state: str = "RUNNING Reason=None",
    **env: str,
) -> tuple[subprocess.Popen[str], Path]:
    """run_training of common.sh with stand-ins for srun, squeue and scontrol, started."""
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    (state / "codes").write_text("\n".join(codes) + "\n")
    _stand_in(bin_dir, "srun", FAKE_STEP)
    _stand_in(bin_dir, "squeue", "echo '1:00:00 59:30'")
    _stand_in(
        bin_dir,
        "scontrol",
        f'if [[ $1 == show ]]; then echo "JobId=7 JobState={job_state}";'
        f' else echo "$*" >> "$STATE/scontrol"; fi',
    )
    code = (
        "source slurm/common.sh; activate_environment() { PYTHON=(python); };"
        " set_caches() { :; }; run_training train run.name=runA"
    )
    job = subprocess.Popen(
        ["bash", "-c", code],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE": str(state), "SLURM_JOB_ID": "7", **env},
        start_new_session=True,  # a process group of its own: the whole job can be killed
    )
    return job, state


def _read_until(job: subprocess.Popen[str], text: str) -> str:
    """The job's output up to the first line containing `text`."""
    assert job.stdout
    seen = ""
    while text not in seen:
        line = job.stdout.readline()
        assert line, seen  # the job ended without printing it
        seen += line
    return seen


def _wait_file(path: Path, job: subprocess.Popen[str]) -> None:
    """Wait until `path` exists; fail at once if the job ended without making it."""
    while not path.exists():
        assert job.poll() is None, job.communicate()[0]
        time.sleep(0.05)


@pytest.mark.parametrize(("reason", "requeued"), [("TimeLimit", True), ("None", False)])
def test_term_during_a_slow_checkpoint_after_usr1_still_requeues(
    default_bake, tmp_path: Path, reason: str, requeued: bool
) -> None:
    # USR1 starts the stop; the limit's TERM arrives while the checkpoint is still being
    # written (the reported failure: "stopped by SIGTERM ... no requeue"). What Slurm 22.05
    # shows then: reason TimeLimit at the limit, None after scancel, which stays stopped.
    project = _mini_project(default_bake.project, tmp_path)
    job, state = _training_job(project, tmp_path, ["stop"], f"COMPLETING Reason={reason}")
    _wait_file(state / "started-1", job)
    job.send_signal(signal.SIGUSR1)
    _wait_file(state / "saving", job)
    job.send_signal(signal.SIGTERM)
    seen = _read_until(job, "received SIGTERM")  # the script has noted the TERM
    (state / "release").touch()  # now the checkpoint is complete
    out = seen + job.communicate(timeout=HANG_S)[0]
    assert "received SIGTERM" in out, out
    requeue_calls = (state / "scontrol").read_text() if (state / "scontrol").exists() else ""
    assert ("requeue 7" in requeue_calls) == requeued, out
    assert ("stopped by SIGTERM" in out) == (not requeued), out
    assert job.returncode == (0 if requeued else 3), out
    took = int(re.search(r"the stop took (\d+) s from SIGUSR1", out)[1])
    assert (project / "logs" / ".stop-seconds-runA").read_text().strip() == str(took)


def test_a_stop_killed_at_the_limit_still_raises_the_next_grace(
    default_bake, tmp_path: Path
) -> None:
    # USR1 starts the stop; the checkpoint is still being written when the job is killed (the
    # limit's KILL): nothing reports the stop, yet its record holds the whole grace, so the
    # run's next segment stops twice as early (plus 30 s).
    project = _mini_project(default_bake.project, tmp_path)
    job, state = _training_job(project, tmp_path, ["stop"])
    _wait_file(state / "started-1", job)
    job.send_signal(signal.SIGUSR1)
    _wait_file(state / "saving", job)
    os.killpg(job.pid, signal.SIGKILL)  # the job script, its timer and the step, as Slurm does
    job.communicate(timeout=HANG_S)
    record = project / "logs" / ".stop-seconds-runA"
    assert record.read_text().strip() == "300"  # the grace of a one-hour limit
    code = 'RUN_KEY=runA; schedule_stop; [[ -z ${TIMER_PID:-} ]] || kill "$TIMER_PID"'
    bin_dir = tmp_path / "bin"
    res = _run_common_sh(project, code, f"{bin_dir}:/usr/bin:/bin", SLURM_JOB_ID="7")
    assert "630 s before the limit (twice the 300 s" in res.stdout + res.stderr, res.stdout


def test_slow_stop_warns_with_both_figures(default_bake, tmp_path: Path) -> None:
    project = _mini_project(default_bake.project, tmp_path)
    job, state = _training_job(project, tmp_path, ["stop"], STOP_GRACE="1")
    _wait_file(state / "started-1", job)
    job.send_signal(signal.SIGUSR1)
    _wait_file(state / "saving", job)
    # Hold the checkpoint until more than half the 1 s grace has passed on the job's clock
    # (whole seconds): the figure measured, not an event, so this one test waits 1.5 s.
    start = time.monotonic()
    while time.monotonic() - start < 1.5:
        assert job.poll() is None
        time.sleep(0.1)
    (state / "release").touch()
    out, _ = job.communicate(timeout=HANG_S)
    took = int(re.search(r"warning: the stop took (\d+) s, more than half the 1 s grace", out)[1])
    assert took >= 1 and f"STOP_GRACE={2 * took + 30}" in out, out
    assert "requeue 7" in (state / "scontrol").read_text()


@pytest.mark.parametrize(
    "case",
    [
        (["75", "0"], {}, 2, 0),  # a distributed error: relaunched, resumes, finishes
        (["134", "75", "0"], {}, 3, 0),  # an aborted rank, then a store error
        (["75", "75", "75"], {}, 3, 75),  # the budget (2 relaunches) is spent
        (["75", "0"], {"RETRIES": "0"}, 1, 75),
        (["1", "0"], {}, 1, 1),  # an ordinary error is not retried
    ],
)
def test_transient_failure_relaunches_within_the_budget(
    default_bake, tmp_path: Path, case: tuple[list[str], dict[str, str], int, int]
) -> None:
    codes, env, launches, status = case
    project = _mini_project(default_bake.project, tmp_path)
    job, state = _training_job(project, tmp_path, codes, **env)
    out, _ = job.communicate(timeout=HANG_S)
    assert (job.returncode, int((state / "launches").read_text())) == (status, launches), out
    assert out.count("transient failure (exit code") == launches - 1


def test_torchrun_restarts_from_the_same_setting(default_bake, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "scontrol", "echo node1")
    code = 'PYTHON=(python); read_retries; launch_command train; echo "${STEP[*]}"'
    res = _run_common_sh(
        default_bake.project,
        code,
        f"{bin_dir}:/usr/bin:/bin",
        LAUNCHER="torchrun",
        RETRIES="3",
        SLURM_JOB_ID="7",
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_NODELIST="node1",
    )
    assert res.returncode == 0, res.stderr
    assert "--max-restarts=3" in res.stdout.split(), res.stdout


@pytest.mark.parametrize(
    ("gpus", "tasks", "refused"),
    [("0,1,2,3", "1", True), ("0,1,2,3", "4", False), ("0", "1", False), ("0,1", "2(x2)", False)],
)
def test_more_gpus_than_ranks_is_refused_with_the_fix(
    default_bake, gpus: str, tasks: str, refused: bool
) -> None:
    res = _run_common_sh(
        default_bake.project,
        "check_gpus_per_rank",
        CUDA_VISIBLE_DEVICES=gpus,
        SLURM_NTASKS_PER_NODE=tasks,
    )
    assert (res.returncode == 2) == refused, res.stdout + res.stderr
    if refused:
        (line,) = res.stderr.splitlines()
        assert "4 GPUs per node but 1 task(s) per node" in line
        assert "--ntasks-per-node=4" in line


def test_make_gpu_check_runs_every_gpu_test_and_the_benchmarks(default_bake) -> None:
    project = default_bake.project
    python = f"PY={sys.executable}"
    plan = subprocess.run(
        ["make", "-n", "gpu-check", python],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert plan.returncode == 0, plan.stderr
    assert "-m pytest -m gpu tests/test_gpu.py" in plan.stdout
    assert "benchmarks/bench_trainer.py --device cuda" in plan.stdout
    assert "benchmarks/bench_checkpoint.py --device cuda" in plan.stdout
    # Budgets of the steps: within the 8 minutes the check promises.
    assert sum(int(t) for t in re.findall(r"^timeout (\d+) ", plan.stdout, re.MULTILINE)) <= 480
    # Without CUDA (here) it stops at once with one line instead of skipping every test.
    res = subprocess.run(
        ["make", "gpu-check", python], cwd=project, capture_output=True, text=True, check=False
    )
    assert res.returncode != 0
    assert "make gpu-check: no CUDA device here" in res.stderr.splitlines()[0]


@pytest.mark.parametrize("preset", PRESETS)
def test_mig_slices_of_a_preset_agree_with_their_memory(preset: str) -> None:
    # A MIG profile names its memory (1g.20gb: 20 GB): the partition's gpu_memory and the
    # interactive request must tell the same story as the slice type.
    data = tomllib.loads((ROOT / "presets" / f"{preset}.toml").read_text())
    for name, part in data["partitions"].items():
        mig = re.fullmatch(r"\dg\.(\d+)gb", part["gpu_type"])
        if mig:
            assert part["gpu_memory"].startswith(f"{mig[1]}G"), (name, part)
    request = data["interactive_gpu_request"].partition("=")[2].split(":")[-2]
    interactive = data["partitions"].get(data["interactive_partition"])
    if interactive and re.fullmatch(r"\dg\.\d+gb", request):
        assert interactive["gpu_type"] == request


# Stands in for `python -m PKG train` in slurm/pack.sbatch: records its run, then does what
# $STATE/<run name> says: "stop" waits for USR1 and exits with the requeue code, a number
# exits with it.
FAKE_RUN = """
trap 'usr1=1' USR1
usr1=0
echo "$RUN_NAME $PACKED_RUNS $*" >> "$STATE/calls"
echo "training $RUN_NAME"
what=$(cat "$STATE/$RUN_NAME")
touch "$STATE/started-$RUN_NAME"
if [[ "$what" == stop ]]; then
    until ((usr1)); do sleep 0.05; done
    exit 3
fi
exit "$what"
"""


@pytest.mark.parametrize(
    "case",
    [
        ({"7_0": "stop", "7_1": "stop"}, 0, True, "requeueing 7 (requeue 1 of at most 20)"),
        ({"7_0": "stop", "7_1": "1"}, 1, False, "1 run(s) checkpointed: submit the job again"),
        ({"7_0": "finished", "7_1": "stop"}, 0, True, "run 7_0 (line 0) finished in an earlier"),
    ],
)
def test_packed_job_signals_every_run_and_requeues_once_all_checkpointed(
    default_bake, tmp_path: Path, case: tuple[dict[str, str], int, bool, str]
) -> None:
    outcomes, status, requeued, says = case
    project = _mini_project(default_bake.project, tmp_path)
    (project / "slurm" / "pack.sbatch").write_text(
        (default_bake.project / "slurm" / "pack.sbatch").read_text()
    )
    (project / "slurm" / "sweep_params.txt").write_text("train.lr=0.1\ntrain.lr=0.2\nx=3\n")
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    for run, what in outcomes.items():
        (state / run).write_text(what)
        if what == "finished":  # a summary as the trainer writes it
            (project / "runs" / run).mkdir(parents=True)
            (project / "runs" / run / "summary.json").write_text('{\n  "status": "finished"\n}\n')
    _stand_in(bin_dir, "python", FAKE_RUN)
    _stand_in(bin_dir, "scontrol", 'echo "$*" >> "$STATE/scontrol"')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    job = subprocess.Popen(
        ["bash", "slurm/pack.sbatch", "train.epochs=2"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "STATE": str(state),
            "SLURM_JOB_ID": "7",
            "SLURM_CPUS_PER_TASK": "8",
            "VENV_DIR": str(venv),
        },
    )
    launched = [run for run, what in outcomes.items() if what != "finished"]
    for run in launched:
        _wait_file(state / f"started-{run}", job)
    job.send_signal(signal.SIGUSR1)  # as the timer before the limit does
    out, _ = job.communicate(timeout=HANG_S)
    assert job.returncode == status, out
    calls = sorted((state / "calls").read_text().splitlines())
    assert calls == [
        f"{run} 2 -m my_hpc_project train train.epochs=2 train.lr=0.{i + 1}"
        for i, run in enumerate(outcomes)
        if run in launched
    ]
    assert (state / "scontrol").exists() == requeued
    assert says in out
    for run in launched:  # every line of a run's output carries its name
        assert f"[{run}] training {run}" in out
