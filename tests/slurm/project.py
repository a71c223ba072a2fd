"""A baked project made ready for real Slurm jobs, and helpers to submit and inspect them.

The project gets its own `.venv` as its README asks for, made in a fraction of a second: an
empty virtual environment whose `.pth` files add the test venv's packages (torch & co.), the
project's `src/` and the test probe (tests/slurm/probe.py, inert unless a test enables it).
The job scripts activate it exactly as they would activate a venv made by `make install`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm.localslurm import LocalSlurm, unavailable_reason

PROBE = Path(__file__).with_name("probe.py")
# How long a wait for a job event may take before a test fails. Every wait polls for the event
# (a job state, a log line, a file) and returns as soon as it happens, so a generous deadline
# costs nothing when things go well and keeps a loaded 2-core machine (load 8, observed to
# slow jobs many times over) from failing tests that are merely slow.
DEADLINE = 900.0


def require_slurm() -> None:
    """Skip (or, where Slurm tests are required, fail) when a local Slurm cannot start."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("REQUIRE_SLURM") == "1" or os.environ.get("CI"):
        pytest.fail(f"Slurm tests are required here (CI/REQUIRE_SLURM) but: {reason}")
    pytest.skip(reason)


def make_venv(project: Path) -> Path:
    """Create `project/.venv` sharing this interpreter's packages; returns its python."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    site = Path(purelib)
    outer = sysconfig.get_paths()["purelib"]
    (site / "outer.pth").write_text(f"{outer}\n{project / 'src'}\n")
    shutil.copy(PROBE, site / "slurm_test_probe.py")
    (site / "slurm_test_probe.pth").write_text("import slurm_test_probe\n")
    return python


@dataclass
class JobProject:
    """A baked project on a local Slurm: submit jobs from its root and read their results."""

    path: Path
    cluster: LocalSlurm
    slug: str = "my_hpc_project"

    @property
    def python(self) -> Path:
        """The project's venv python."""
        return self.path / ".venv" / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """Submit environment: the cluster's, one thread per process, plus `extra`.

        The fake node advertises 64 CPUs on a 2-core machine; one OpenMP thread per rank keeps
        concurrent jobs from thrashing (the job script keeps a preset OMP_NUM_THREADS).
        """
        return {**self.cluster.env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = DEADLINE):
        """Run a command in the project root (e.g. a slurm/*.sh script or the venv python)."""
        return subprocess.run(
            list(args),
            cwd=self.path,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`python -m <slug> ARGS` on this machine (not in a job), like on a login node."""
        res = self.run(str(self.python), "-m", self.slug, *args, env=self.env(**env))
        assert res.returncode == 0, f"{args}: {res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        return res

    def sbatch(self, *args: str, **env: str) -> str:
        """`sbatch --parsable ARGS` from the project root; returns the job id."""
        return self.cluster.submit(*args, cwd=self.path, env=self.env(**env))

    def log(self, name: str) -> str:
        """Text of logs/<name>.out ('' while missing)."""
        path = self.path / "logs" / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, what: str, check, job: str | None, timeout: float = DEADLINE) -> None:
        """Poll `check()` until true; fail at once when `job` has left the queue without it.

        The job's state, not the deadline, ends a wait that can no longer succeed (a job
        that failed at its start, a signal that never came), so a broken job costs seconds.
        """
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if check():
                return
            if job is not None and not self.cluster.queued(job):
                if check():  # it happened just before the job ended
                    return
                state = self.cluster.state(job)
                msg = f"job {job} left the queue ({state}) before {what}"
                raise AssertionError(msg)
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for {what}")

    def finished(self, job_id: str, timeout: float = DEADLINE) -> dict[str, str]:
        """Wait for the job to leave the queue; return its `scontrol show job` fields."""
        self.cluster.wait(job_id, timeout)
        return self.cluster.job(job_id)

    def checkpoints(self, run: str) -> list[Path]:
        """The run's checkpoint files, oldest first."""
        return sorted((self.path / "runs" / run / "checkpoints").glob("*.pt"))

    @staticmethod
    def weights(checkpoint: Path) -> dict:
        """Model weights in one checkpoint file."""
        import torch  # noqa: PLC0415 - heavy, only for the tests that compare weights

        return torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]

    def final_weights(self, run: str) -> dict:
        """Model weights in the run's latest checkpoint."""
        return self.weights(self.checkpoints(run)[-1])


def same_weights(a: dict, b: dict) -> bool:
    """True when two state dicts hold bit-identical tensors."""
    import torch  # noqa: PLC0415

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_difference(a: dict, b: dict) -> float:
    """Largest absolute element difference between two state dicts with equal keys."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def resumed_step(log: str) -> int | None:
    """The step a run resumed from, per its log, if it resumed."""
    found = re.search(r"resumed from step (\d+)", log)
    return int(found.group(1)) if found else None
