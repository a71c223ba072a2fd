"""`doctor --site`: the cluster preset (configs/cluster.toml) against what Slurm reports now.

Partitions, their time limits, GPU types and counts (MIG slice names included), cores and
memory per node come from `sinfo`; default and maximum times from `scontrol show partition`.
Each value that differs is printed with the line of the preset to change. Cluster facts go
stale (a site repartitions its MIG slices, buys nodes, changes limits): this makes them
checkable by anyone with a login.
"""

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]  # one name for either module

from ..errors import ProjectError

SINFO = ["sinfo", "-h", "-o", "%P|%l|%G|%c|%m"]
SCONTROL = ["scontrol", "show", "partition", "-o"]
UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}

Query = Callable[[list[str]], str]


def slurm_seconds(text: str) -> int | None:
    """Seconds of a Slurm time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; None for no limit."""
    text = text.strip()
    if text.upper() in {"INFINITE", "UNLIMITED", "NONE", ""}:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if match is None:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-H[:M[:S]]
        parts = [int(first), int(second or 0), int(third or 0)]
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if third is not None:  # H:M:S
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # M or M:S


def memory_mb(text: str) -> float:
    """Megabytes of a Slurm memory size such as 64G, 500000 (MB) or 1T."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", text.strip().upper())
    if match is None:
        raise ValueError(f"not a memory size: {text!r}")
    return float(match[1]) * UNIT_MB[match[2] or "M"]


@dataclass
class Partition:
    """One partition as sinfo and scontrol report it (node kinds merged)."""

    max_time: int | None = None
    default_time: int | None = None
    gpus: dict[str, set[int]] = field(default_factory=dict)  # GPU type -> counts per node
    cpus: set[int] = field(default_factory=set)
    memory_mb: set[int] = field(default_factory=set)


def gpu_gres(text: str) -> list[tuple[str, int]]:
    """(type, count) of every GPU in a GRES list, e.g. `gpu:A100:4(S:0-1),gpu:1g.20gb:8`."""
    found = []
    for item in re.split(r",(?![^(]*\))", text):  # commas outside "(S:0-1)"
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) in (2, 3) and parts[-1].isdigit():
            found.append((parts[1] if len(parts) == 3 else "", int(parts[-1])))
    return found


def parse_sinfo(text: str) -> dict[str, Partition]:
    """Partitions from `sinfo -h -o '%P|%l|%G|%c|%m'`: one line per partition and node kind."""
    partitions: dict[str, Partition] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, limit, gres, cpus, memory = line.split("|")
        part = partitions.setdefault(name.rstrip("*"), Partition())
        part.max_time = slurm_seconds(limit)
        for kind, count in gpu_gres(gres):
            part.gpus.setdefault(kind, set()).add(count)
        part.cpus.add(int(cpus.rstrip("+")))  # "64+": nodes of at least 64
        part.memory_mb.add(int(memory.rstrip("+")))
    return partitions


def add_scontrol(partitions: dict[str, Partition], text: str) -> None:
    """Default and maximum times from `scontrol show partition -o` (one line per partition)."""
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("PartitionName") in partitions:
            part = partitions[fields["PartitionName"]]
            part.default_time = slurm_seconds(fields.get("DefaultTime", "NONE"))
            part.max_time = slurm_seconds(fields.get("MaxTime", "UNLIMITED"))


def _request_type(request: str) -> str:
    """The GPU type of a request such as --gpus-per-node=1g.20gb:1 or --gres=gpu:A100:1."""
    value = request.partition("=")[2].split(":")
    value = value[1:] if value and value[0] == "gpu" else value
    return value[0] if len(value) == 2 else ""


def _counts(values: set[int]) -> str:
    return ", ".join(str(v) for v in sorted(values))


def _partition(
    name: str, want: dict[str, Any], part: Partition, memory: str
) -> list[tuple[str, str]]:
    """(what differs, preset line) for one partition of the preset found on the cluster."""
    where, section = f"partition {name}:", f'[partitions."{name}"]'
    found = []
    kind, gpus, cpus = want["gpu_type"], want["gpus_per_node"], want["cpus_per_node"]
    if kind and part.gpus and kind not in part.gpus:
        offered = ", ".join(sorted(part.gpus))
        what = f"{where} GPU type {kind} not offered; sinfo shows {offered}"
        found.append((what, f'{section} gpu_type = "{kind}"'))
    counts = part.gpus.get(kind) if kind else part.gpus.get("")
    if counts and gpus not in counts:
        what = f"{where} {gpus} GPUs per node in the preset, nodes have {_counts(counts)}"
        found.append((what, f"{section} gpus_per_node = {gpus}"))
    if part.cpus and cpus != min(part.cpus):
        what = f"{where} {cpus} cores per node in the preset, nodes have {_counts(part.cpus)}"
        found.append(
            (f"{what} (the preset keeps the smallest)", f"{section} cpus_per_node = {cpus}")
        )
    if slurm_seconds(want["max_time"]) != part.max_time:
        limit = "none" if part.max_time is None else f"{part.max_time} s"
        what = f"{where} time limit {want['max_time']} in the preset, Slurm says {limit}"
        found.append((what, f'{section} max_time = "{want["max_time"]}"'))
    # Projects made before the preset had node_memory have none: nothing to compare.
    ceiling = want.get("node_memory", "")
    if ceiling and part.memory_mb and memory_mb(ceiling) > min(part.memory_mb):
        smallest = min(part.memory_mb) / 1024
        what = f"{where} node memory {ceiling} in the preset, the smallest node has {smallest:.0f}G"
        found.append((what, f'{section} node_memory = "{ceiling}"'))
    asked = memory_mb(memory.removesuffix("/gpu")) * (gpus if memory.endswith("/gpu") else 1)
    if part.memory_mb and asked > min(part.memory_mb):
        smallest = min(part.memory_mb) / 1024
        what = f"{where} {memory} for {gpus} GPUs asks {asked / 1024:.0f}G"
        found.append(
            (f"{what}, the smallest node has {smallest:.0f}G", f'default_memory = "{memory}"')
        )
    return found


def compare(preset: dict[str, Any], live: dict[str, Partition]) -> list[tuple[str, str]]:
    """(what differs, the preset line to change) for every preset value the cluster contradicts."""
    found: list[tuple[str, str]] = []
    for name, want in preset["partitions"].items():
        if name not in live:
            found.append((f"partition {name}: not on this cluster", f'[partitions."{name}"]'))
        else:
            found += _partition(name, want, live[name], preset["default_memory"])
    for key in ("batch_partition", "interactive_partition"):
        found += [
            (f"{key} {name}: not on this cluster", f'{key} = "{preset[key]}"')
            for name in preset[key].split(",")
            if name not in live
        ]
    request, place = preset["interactive_gpu_request"], preset["interactive_partition"]
    slice_type, interactive = _request_type(request), live.get(place)
    if slice_type and interactive and interactive.gpus and slice_type not in interactive.gpus:
        offered = ", ".join(sorted(interactive.gpus))
        what = f"interactive GPU {slice_type} not offered on {place}; sinfo shows {offered}"
        found.append((what, f'interactive_gpu_request = "{request}"'))
    limit = slurm_seconds(preset["default_time"])
    for name in preset["batch_partition"].split(","):
        part = live.get(name)
        if part and part.max_time is not None and limit is not None and limit > part.max_time:
            what = f"the jobs' --time {preset['default_time']} exceeds the limit of {name}"
            found.append((what, f'default_time = "{preset["default_time"]}" (and #SBATCH --time)'))
    source = f"presets/{preset['preset']}.toml and configs/cluster.toml"
    return [(what, f"{source}: {line}") for what, line in found]


def _query(argv: list[str]) -> str:
    # Fixed arguments of the site's own sinfo/scontrol from PATH, no shell.
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)  # noqa: S603
    if done.returncode != 0:
        raise ProjectError(f"doctor --site: {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def run_site_check(project_root: Path, query: Query | None = None) -> list[tuple[str, str]]:
    """Print every difference between configs/cluster.toml and the cluster; return them."""
    path = project_root / "configs" / "cluster.toml"
    if not path.is_file():
        raise ProjectError(f"doctor --site: {path} is missing (it comes with the template)")
    if query is None:
        if shutil.which("sinfo") is None:
            raise ProjectError("doctor --site: no sinfo here: run it on the cluster's login node")
        query = _query
    preset = tomllib.loads(path.read_text(encoding="utf-8"))
    live = parse_sinfo(query(SINFO))
    add_scontrol(live, query(SCONTROL))
    found = compare(preset, live)
    var = preset["node_tmp_var"]
    if os.environ.get("SLURM_JOB_ID") and not os.environ.get(var):
        found.append((f"node-local disk: ${var} is not set in this job", f'node_tmp_var = "{var}"'))
    for what, line in found:
        print(f"differs: {what}\n  change: {line}")
    names = ", ".join(sorted(live))
    print(
        f"site check: {len(found)} difference(s) between the {preset['preset']} preset and "
        f"this cluster (partitions: {names})"
    )
    return found
