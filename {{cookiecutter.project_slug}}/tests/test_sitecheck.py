"""`doctor --site` against recorded sinfo/scontrol output in Slurm's formats."""

import os
from pathlib import Path

import pytest

from conftest import ROOT, pkg

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PRESET = tomllib.loads((ROOT / "configs" / "cluster.toml").read_text(encoding="utf-8"))

# `sinfo -h -o '%P|%l|%G|%c|%m'` on a GPU cluster: one line per partition and node kind,
# GRES with socket affinity, the default partition starred, a CPU partition without GRES.
SINFO = """\
gpu-a|2-00:00:00|gpu:A100:4(S:0-1)|64|500000
gpu-a|2-00:00:00|gpu:A100:8(S:0-1)|128|1000000
gpu-mig|12:00:00|gpu:1g.10gb:8(S:0-1),gpu:2g.10gb:4(S:0-1),gpu:3g.20gb:4(S:0-1)|64|500000
medium*|2-00:00:00|(null)|96+|384000
"""
# `scontrol show partition -o`, shortened to the fields that matter (real lines have ~40).
SCONTROL = """\
PartitionName=gpu-a AllowGroups=ALL Default=NO DefaultTime=12:00:00 GraceTime=0 MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 State=UP TotalCPUs=192 TRES=cpu=192,mem=1464G,node=2,billing=192,gres/gpu=12
PartitionName=gpu-mig AllowGroups=ALL Default=NO DefaultTime=01:00:00 GraceTime=0 MaxNodes=UNLIMITED MaxTime=12:00:00 MinNodes=0 State=UP TotalCPUs=64
PartitionName=medium AllowGroups=ALL Default=YES DefaultTime=NONE MaxTime=2-00:00:00 State=UP
"""  # noqa: E501 - recorded lines


def _part(gpu_type: str, gpus: int, cpus: int, node_memory: str = "") -> dict:
    return {
        "gpu_type": gpu_type,
        "gpus_per_node": gpus,
        "cpus_per_node": cpus,
        "max_time": "2-0",
        "node_memory": node_memory,
    }


PRESET_A = {
    "preset": "site",
    "batch_partition": "gpu-a",
    "interactive_partition": "gpu-mig",
    "interactive_gpu_request": "--gpus-per-node=1g.20gb:1",
    "default_time": "12:00:00",
    "default_memory": "64G/gpu",
    "node_tmp_var": "LOCAL_TMPDIR",
    "partitions": {
        "gpu-a": _part("A100", 8, 128, "1T"),
        "gpu-mig": _part("1g.20gb", 4, 64),
        "gone": _part("H100", 4, 96),
    },
}


def test_slurm_times_and_sizes_in_every_format() -> None:
    site = pkg("ops.sitecheck")
    times = {"5": 300, "30:00": 1800, "2:00:00": 7200, "1-00": 86400, "1-6:30": 109800}
    assert {t: site.slurm_seconds(t) for t in times} == times
    assert site.slurm_seconds("2-00:00:00") == 172800
    assert site.slurm_seconds("infinite") is None and site.slurm_seconds("UNLIMITED") is None
    assert site.memory_mb("64G") == 65536 and site.memory_mb("500000") == 500000
    assert site.gpu_gres("gpu:A100:4(S:0-1),gpu:1g.20gb:2,fpga:1") == [("A100", 4), ("1g.20gb", 2)]
    assert site.gpu_gres("gpu:2") == [("", 2)] and site.gpu_gres("(null)") == []


def test_every_difference_is_named_with_the_line_to_change() -> None:
    site = pkg("ops.sitecheck")
    live = site.parse_sinfo(SINFO)
    site.add_scontrol(live, SCONTROL)
    assert live["gpu-a"].gpus == {"A100": {4, 8}} and live["medium"].cpus == {96}
    found = site.compare(PRESET_A, live)
    expected = [
        # the MIG slice of the preset is not among those offered
        ("gpu-mig: GPU type 1g.20gb not offered; sinfo shows 1g.10gb, 2g.10gb, 3g.20gb",
         '[partitions."gpu-mig"] gpu_type = "1g.20gb"'),
        ("interactive GPU 1g.20gb not offered on gpu-mig", 'interactive_gpu_request = "--gpus'),
        # the preset keeps the smallest node: 64 cores, not 128
        ("gpu-a: 128 cores per node in the preset, nodes have 64, 128",
         '[partitions."gpu-a"] cpus_per_node = 128'),
        # 64G per GPU x 8 GPUs = 512G > the 4-GPU node's 488G
        ("gpu-a: 64G/gpu for 8 GPUs asks 512G, the smallest node has 488G",
         'default_memory = "64G/gpu"'),
        # the memory ceiling of the preset is above the smallest node's (gpu-mig: unknown)
        ("gpu-a: node memory 1T in the preset, the smallest node has 488G",
         '[partitions."gpu-a"] node_memory = "1T"'),
        ("gpu-mig: time limit 2-0 in the preset, Slurm says 43200 s",
         '[partitions."gpu-mig"] max_time = "2-0"'),
        ("partition gone: not on this cluster", '[partitions."gone"]'),
    ]  # fmt: skip
    assert len(found) == len(expected), found
    for what, line in expected:
        assert any(what in w and line in ln for w, ln in found), (what, found)
    assert all(ln.startswith("presets/site.toml and configs/cluster.toml: ") for _, ln in found)


def _recorded_for(preset: dict) -> tuple[str, str]:
    """sinfo and scontrol output of a cluster exactly as `preset` describes it."""
    sinfo, scontrol = [], []
    for name, part in preset["partitions"].items():
        gres = (
            f"gpu:{part['gpu_type']}:{part['gpus_per_node']}(S:0-1)"
            if part["gpu_type"]
            else "gpu:8"
        )
        sinfo.append(f"{name}|{part['max_time']}|{gres}|{part['cpus_per_node']}|4000000")
        scontrol.append(
            f"PartitionName={name} DefaultTime=NONE MaxTime={part['max_time']} State=UP"
        )
    return "\n".join(sinfo) + "\n", "\n".join(scontrol) + "\n"


def test_the_shipped_preset_agrees_with_a_cluster_as_it_describes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    sinfo, scontrol = _recorded_for(PRESET)
    interactive = pkg("ops.sitecheck")._request_type(PRESET["interactive_gpu_request"])
    if interactive:  # the interactive partition offers the slice the scripts ask for
        name = PRESET["interactive_partition"]
        sinfo += f"{name}|{PRESET['partitions'][name]['max_time']}|gpu:{interactive}:8|64|4000000\n"
    answers = {"sinfo": sinfo, "scontrol": scontrol}
    found = pkg("ops.sitecheck").run_site_check(ROOT, lambda argv: answers[argv[0]])
    assert found == []
    assert "site check: 0 difference(s)" in capsys.readouterr().out


def test_doctor_site_runs_the_sites_commands(
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Stand-ins for the cluster's sinfo and scontrol print the recorded output.
    (project / "configs").mkdir()
    (project / "configs" / "cluster.toml").write_text(
        (ROOT / "configs" / "cluster.toml").read_text()
    )
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in (("sinfo", SINFO), ("scontrol", SCONTROL)):
        (tools / f"{name}.out").write_text(text)
        (tools / name).write_text(f"#!/bin/sh\ncat '{tools / name}.out'\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert pkg("cli").main(["doctor", "--site"]) == 0
    out = capsys.readouterr().out
    for name in PRESET["partitions"]:  # none of the shipped preset's partitions is here
        assert f"differs: partition {name}: not on this cluster" in out
    assert "partitions: gpu-a, gpu-mig, medium)" in out
