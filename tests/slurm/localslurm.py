"""A real, throw-away Slurm cluster on this machine for the template's tests.

Debian's Slurm 22.05 (`slurmctld`, `slurmd`, `slurm-client`) and `munge` start as root in about
a second. Every instance lives in its own directory: its own munged (own key and socket), its
own ports, config, state, spool, logs and PIDs, so nothing under /etc/slurm or /run is touched
and two instances never meet. Clients find the instance through `SLURM_CONF`, which jobs
inherit, so `srun` inside a job talks to the same instance.

Facts behind the settings (measured, see the research notes on local Slurm):
- munged refuses to run as root here; it runs as the `munge` user.
- `AuthInfo=cred_expire=10`: a requeued job starts again after ~12 s instead of ~2 min.
- `EnforcePartLimits=ALL`: an over-limit job is rejected at submit instead of pending forever.
- `SlurmdParameters=config_overrides`: nodes may be declared bigger than the hardware, so job
  scripts written for a GPU cluster (8 CPUs and 64G per GPU) are accepted on a 2-core VM.
- Fake GPUs are character devices identical to /dev/null listed in gres.conf.
- Several slurmd per host work (Debian builds with MULTIPLE_SLURMD): `slurmd -N nodeX`.
- Teardown order: cancel jobs, then slurmd, then slurmctld, then munged; by PID only.

Command line (for trying things by hand):
    python tests/slurm/localslurm.py up DIR [--nodes node1,node2]
    SLURM_CONF=DIR/slurm.conf sinfo
    python tests/slurm/localslurm.py down DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED_PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged", "munge")
HOSTS_MARK = "# hpc-ml-template local slurm"
FAKE_GPU_DEVICE = "/dev/fakegpu{}"
PRESET_DIR = Path(__file__).resolve().parents[2] / "presets"


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot start here, or None when it can."""
    if os.geteuid() != 0:
        return "local Slurm needs root (slurmd and munged run as root/munge)"
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing:
        return (
            f"missing {', '.join(missing)}: apt-get install slurmctld slurmd slurm-client munge"
            " (see .ci/apt-packages.txt)"
        )
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "user 'munge' missing (install the munge package)"
    return None


def short_hostname() -> str:
    """This machine's name without the domain (what `hostname -s` prints)."""
    return socket.gethostname().split(".")[0]


def free_port() -> int:
    """A TCP port that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_presets(preset_dir: Path) -> dict[str, dict]:
    """The cluster presets of the template, by name."""
    return {p.stem: tomllib.loads(p.read_text()) for p in sorted(preset_dir.glob("*.toml"))}


def partitions_from_presets(presets: dict[str, dict]) -> dict[str, str]:
    """Every partition named in the presets with its max time (batch/interactive included)."""
    parts: dict[str, str] = {}
    for data in presets.values():
        for name, spec in data.get("partitions", {}).items():
            parts[name] = spec.get("max_time", "INFINITE")
        for key in ("batch_partition", "interactive_partition"):
            parts.setdefault(data[key], "INFINITE")
    return parts


def features_from_presets(presets: dict[str, dict]) -> list[str]:
    """Node features the presets' scripts ask for (e.g. `inet`, internet access on Grete)."""
    return sorted(
        {p["internet_constraint"] for p in presets.values() if p.get("internet_constraint")}
    )


def gpu_types_from_presets(presets: dict[str, dict]) -> dict[str, int]:
    """Fake GPU types a node needs for every preset's requests, with a count per type.

    The batch type (e.g. A100) and the interactive one (e.g. a MIG slice `1g.20gb`), as many
    of each as the largest partition has GPUs per node.
    """
    types: dict[str, int] = {}
    for data in presets.values():
        count = max([8, *(p.get("gpus_per_node", 0) for p in data.get("partitions", {}).values())])
        # "--gres=gpu:TYPE:N", "--gpus-per-node=TYPE:N": TYPE when present
        value = data.get("interactive_gpu_request", "").partition("=")[2].split(":")
        value = value[1:] if value[0] == "gpu" else value
        found = [data.get("gpu_type", ""), value[0] if len(value) == 2 else ""]
        found += [p.get("gpu_type", "") for p in data.get("partitions", {}).values()]
        for name in filter(None, found):
            types[name] = max(types.get(name, 0), count)
    return types or {"A100": 8}


@dataclass
class LocalSlurm:
    """One Slurm instance rooted at `root` (created, must not be inside a 0700 directory)."""

    root: Path
    nodes: list[str] = field(default_factory=lambda: [short_hostname()])
    cpus: int = 64
    mem_mb: int = 512_000
    # By default shaped by the template's presets, so their scripts run unchanged: every
    # partition (with its max time), every GPU type they request, every node feature.
    partitions: dict[str, str] = field(
        default_factory=lambda: partitions_from_presets(load_presets(PRESET_DIR))
    )
    gpus: dict[str, int] = field(  # fake GPUs per type
        default_factory=lambda: gpu_types_from_presets(load_presets(PRESET_DIR))
    )
    features: list[str] = field(  # for --constraint
        default_factory=lambda: features_from_presets(load_presets(PRESET_DIR))
    )
    pids: dict[str, int] = field(default_factory=dict)
    added_hosts: bool = False

    # ------------------------------------------------------------------ paths and env
    @property
    def conf(self) -> Path:
        """The instance's slurm.conf."""
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for client commands and jobs of this instance."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for var in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if var != "SLURM_CONF":
                del env[var]
        return env

    def run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
        """Run a client command (sbatch, squeue, ...) against this instance."""
        kw.setdefault("env", self.env)
        return subprocess.run(
            # Generous: squeue once took over 120 s on a 2-core machine at load 8.
            list(args),
            check=check,
            capture_output=True,
            text=True,
            timeout=600,
            **kw,
        )

    # ------------------------------------------------------------------ config
    def _write_munge(self) -> Path:
        mdir = self.root / "munge"
        mdir.mkdir()
        mdir.chmod(0o755)  # munged: socket dir searchable by all, writable by munge only
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        user = pwd.getpwnam("munge")
        for path in (mdir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        return mdir

    def _write_config(self, munge_socket: Path) -> None:
        for sub in ("state", "log", "run", *(f"spool-{n}" for n in self.nodes)):
            (self.root / sub).mkdir()
        ctld_port = free_port()
        gres_lines = []
        # One fake device file per GPU of a node (all nodes may share them): char devices
        # identical to /dev/null; gres.conf without File= makes the node invalid.
        first = 0
        for gpu_type, count in self.gpus.items():
            for i in range(first, first + count):
                dev = Path(FAKE_GPU_DEVICE.format(i))
                if not dev.exists():
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            files = FAKE_GPU_DEVICE.format(f"[{first}-{first + count - 1}]")
            gres_lines.append(
                f"NodeName={','.join(self.nodes)} Name=gpu Type={gpu_type} File={files}"
            )
            first += count
        gres = ",".join(f"gpu:{t}:{n}" for t, n in self.gpus.items())
        node_lines = [
            f"NodeName={name} NodeHostname={short_hostname()} NodeAddr=127.0.0.1"
            f" Port={free_port()} CPUs={self.cpus} RealMemory={self.mem_mb}"
            f"{' Gres=' + gres if gres else ''}"
            f"{' Features=' + ','.join(self.features) if self.features else ''} State=UNKNOWN"
            for name in self.nodes
        ]
        # Preemptible partitions (by name, e.g. grete:preemptible) rank below the others: a
        # job elsewhere that needs their resources preempts their jobs, which get SIGTERM,
        # GraceTime seconds to checkpoint, and are requeued, as on a cluster with
        # PreemptMode=REQUEUE.
        part_lines = [
            f"PartitionName={name} Nodes=ALL Default={'YES' if i == 0 else 'NO'}"
            f" MaxTime={max_time} State=UP"
            + (
                " PriorityTier=1 PreemptMode=REQUEUE GraceTime=30"
                if "preemptible" in name
                else " PriorityTier=10 PreemptMode=OFF"
            )
            for i, (name, max_time) in enumerate(self.partitions.items())
        ]
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName=local{os.getpid()}",
                    f"SlurmctldHost={short_hostname()}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={munge_socket},cred_expire=10",
                    "MpiDefault=none",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MailProg=/bin/true",
                    "ReturnToService=2",
                    "EnforcePartLimits=ALL",
                    "SlurmdParameters=config_overrides",
                    f"SlurmctldPidFile={r}/run/slurmctld.pid",
                    f"SlurmdPidFile={r}/run/slurmd-%n.pid",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool-%n",
                    f"SlurmctldLogFile={r}/log/slurmctld.log",
                    f"SlurmdLogFile={r}/log/slurmd-%n.log",
                    f"PlugStackConfig={r}/plugstack.conf",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=bf_interval=1,sched_interval=2",
                    "DependencyParameters=kill_invalid_depend",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "DefMemPerCPU=1000",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=600",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "GresTypes=gpu",
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=REQUEUE",
                    *node_lines,
                    *part_lines,
                    "",
                ]
            )
        )
        (r / "gres.conf").write_text("\n".join([*gres_lines, ""]))
        (r / "plugstack.conf").write_text("")

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self, key: str, argv: list[str], **kw) -> None:
        with (self.root / "log" / f"{key}.stderr").open("ab") as log:
            proc = subprocess.Popen(
                argv,
                env={**self.env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C in the terminal must not hit the daemons
                **kw,
            )
        self.pids[key] = proc.pid
        (self.root / "pids.json").write_text(json.dumps(self.pids))

    def _ensure_hosts(self) -> None:
        """Make node names that are not this host resolve (jobs derive MASTER_ADDR from them)."""
        unresolved = []
        for name in self.nodes:
            try:
                socket.gethostbyname(name)
            except OSError:
                unresolved.append(name)
        if unresolved:
            with Path("/etc/hosts").open("a") as f:
                f.write(f"127.0.0.1 {' '.join(unresolved)} {HOSTS_MARK} {self.root}\n")
            self.added_hosts = True

    def start(self, timeout: float = 30) -> None:
        """Write the config and start munged, slurmctld and one slurmd per node."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        closed = [p for p in self.root.parents if not p.stat().st_mode & 0o001]
        if closed:  # munged runs as user munge and must reach its socket directory
            msg = f"{closed[0]} is not searchable by other users; use a root under /tmp"
            raise RuntimeError(msg)
        try:
            self._start_daemons(timeout)
        except BaseException:
            self.stop()
            raise

    def _start_daemons(self, timeout: float) -> None:
        mdir = self._write_munge()
        sock = mdir / "munge.socket"
        self._write_config(sock)
        self._ensure_hosts()
        self._spawn(
            "munged",
            [
                shutil.which("munged") or "munged",
                "--foreground",
                f"--socket={sock}",
                f"--key-file={mdir / 'munge.key'}",
                f"--pid-file={mdir / 'munged.pid'}",
                f"--log-file={mdir / 'munged.log'}",
                f"--seed-file={mdir / 'munged.seed'}",
            ],
            user="munge",
            group="munge",
            extra_groups=[],
        )
        self._wait(sock.exists, timeout, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._all_idle, timeout, "all nodes idle")

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
        states = {tuple(line.split()) for line in out if line.strip()}
        return states == {(n, "idle") for n in self.nodes}

    def _wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for key, pid in self.pids.items():
                if not _alive(pid):
                    msg = f"{key} exited during start; logs in {self.root / 'log'}"
                    raise RuntimeError(msg + "\n" + self.logs_tail())
            if cond():
                return
            time.sleep(0.1)
        raise TimeoutError(f"timed out waiting for {what}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 20) -> str:
        """The last lines of every daemon log, for failure messages."""
        out = []
        for log in sorted((self.root / "log").glob("*")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"== {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel all jobs, then stop slurmd(s), slurmctld and munged, by PID."""
        if not self.pids and (self.root / "pids.json").exists():
            self.pids = json.loads((self.root / "pids.json").read_text())
        ctld = self.pids.get("slurmctld")
        if ctld and _alive(ctld):
            # Jobs first: steps outlive a killed slurmd (reparented to PID 1).
            self.run("scancel", "--user=root", check=False)
            end = time.monotonic() + 30
            while time.monotonic() < end and self.run("squeue", "-h", check=False).stdout:
                time.sleep(0.3)
        slurmds = [k for k in self.pids if k.startswith("slurmd-")]
        for group in (slurmds, ["slurmctld"], ["munged"]):  # each group stops in parallel
            for key in group:
                if key in self.pids and _alive(self.pids[key]):
                    os.kill(self.pids[key], signal.SIGTERM)
            for key in group:
                if key in self.pids:
                    _reap(self.pids[key])
        self.pids.clear()
        (self.root / "pids.json").unlink(missing_ok=True)
        if self.added_hosts or (self.root / "slurm.conf").exists():
            _remove_hosts_line(str(self.root))

    # ------------------------------------------------------------------ jobs
    def submit(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
        """`sbatch --parsable ARGS` in `cwd`; returns the job id."""
        res = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env or self.env, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` of one job (or array task) as a flat dict."""
        res = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        info: dict[str, str] = {}
        line = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
        for m in re.finditer(r"(\S+?)=(\S*)", line):
            info.setdefault(m.group(1), m.group(2))
        return info

    def state(self, job_id: str) -> str:
        """JobState of one job, '' when unknown."""
        return self.job(job_id).get("JobState", "")

    def queued(self, job_id: str) -> bool:
        """Whether a task of `job_id` is pending, running, completing or being requeued.

        A failed `squeue` (a busy controller) counts as queued; a job Slurm no longer knows
        ("Invalid job id") does not.
        """
        res = self.run("squeue", "-h", "-j", job_id, check=False)
        if res.returncode != 0:
            return "Invalid job id" not in res.stderr
        return bool(res.stdout.strip())

    def wait(self, job_id: str, timeout: float = 900) -> None:
        """Block until no task of `job_id` is pending, running or completing."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.queued(job_id):
                return
            time.sleep(0.3)
        self.run("scancel", job_id, check=False)
        raise TimeoutError(f"job {job_id} still queued after {timeout} s")


@contextlib.contextmanager
def temporary_cluster(prefix: str, **options) -> Iterator[LocalSlurm]:
    """A started instance in a fresh directory under /tmp; stopped and removed afterwards."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # make test-all runs only unmarked tests on its workers; a cluster there: a missing mark.
        msg = "a local Slurm started on a pytest-xdist worker: mark the test `slurm`"
        raise RuntimeError(msg)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        instance = LocalSlurm(root, **options)
        start = time.monotonic()
        instance.start()
        print(f"\nslurm {','.join(instance.nodes)} up in {time.monotonic() - start:.2f} s")
        try:
            yield instance
        finally:
            start = time.monotonic()
            instance.stop()
            print(f"\nslurm {','.join(instance.nodes)} down in {time.monotonic() - start:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (CLI 'down'): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return waited == 0


def _reap(pid: int, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _remove_hosts_line(root: str) -> None:
    hosts = Path("/etc/hosts")
    lines = hosts.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if not (HOSTS_MARK in ln and ln.rstrip().endswith(root))]
    if kept != lines:
        with hosts.open("w") as f:  # rewrite in place: keeps the inode (bind mounts)
            f.writelines(kept)


def main(argv: list[str] | None = None) -> int:
    """`up DIR [--nodes a,b]` / `down DIR` for trying things by hand."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--nodes", default="", help="comma-separated node names")
    args = ap.parse_args(argv)
    root = args.dir.resolve()
    if args.action == "up":
        reason = unavailable_reason()
        if reason:
            print(reason, file=sys.stderr)
            return 1
        cluster = LocalSlurm(root, nodes=args.nodes.split(",")) if args.nodes else LocalSlurm(root)
        t0 = time.monotonic()
        cluster.start()
        print(f"up in {time.monotonic() - t0:.2f} s; export SLURM_CONF={cluster.conf}")
        return 0
    LocalSlurm(root).stop()
    print("down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
