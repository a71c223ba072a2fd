"""The questions: one source (cookiecutter.json), mirrors in sync, presets complete."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from engines import rules

ROOT = Path(__file__).resolve().parent.parent
CC = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
COPIER = yaml.safe_load((ROOT / "copier.yml").read_text("utf-8"))
QUESTIONS = [k for k in CC if not k.startswith("_")]
PRESET_KEYS = {
    "description",
    "login_host",
    "batch_partition",
    "interactive_partition",
    "gpu_type_required",
    "gpu_request",
    "interactive_gpu_request",
    "modules",
    "container_module",
    "node_tmp_var",
    "default_time",
    "default_memory",
    "default_cpus_per_gpu",
    "home_quota_gb",
    "partitions",
    "internet_constraint",
    "torch_variant",
}
PARTITION_KEYS = {
    "gpu_type", "gpus_per_node", "cpus_per_node", "gpu_memory", "max_time", "node_memory",
}  # fmt: skip
REQUIRED = {
    "project_name",
    "project_slug",
    "description",
    "author_name",
    "author_email",
    "license",
    "python_version",
    "cluster",
    "account",
    "partition",
    "nodes",
    "gpus_per_node",
    "cpus_per_gpu",
    "memory",
    "time_limit",
    "mail",
    "environment",
    "tracking",
    "example",
    "ci",
    "vscode",
    "snakemake",
}


def test_mirrors_are_in_sync() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools/sync_questions.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_required_questions_exist_with_help() -> None:
    assert set(QUESTIONS) >= REQUIRED
    for name in QUESTIONS:
        help_text = CC["__prompts__"][name]
        assert help_text.strip() and "\n" not in help_text, name


@pytest.mark.parametrize("name", QUESTIONS)
def test_copier_question_mirrors_cookiecutter(name: str) -> None:
    question = COPIER[name]
    assert question["help"] == CC["__prompts__"][name]
    if isinstance(CC[name], list):
        assert question["choices"] == CC[name]
        assert question["default"] == CC[name][0]
    else:
        assert question["default"] == CC[name].replace("cookiecutter._presets", "presets").replace(
            "cookiecutter.", ""
        )


def test_copier_asks_nothing_cookiecutter_does_not() -> None:
    asked = [k for k, v in COPIER.items() if not k.startswith("_") and v.get("when") is not False]
    assert asked == QUESTIONS


def test_choice_defaults() -> None:
    assert CC["cluster"][0] == "grete"
    assert CC["python_version"] == ["3.11", "3.10", "3.12", "3.13"]
    assert CC["license"] == ["MIT", "BSD-3-Clause", "Apache-2.0", "proprietary"]
    assert CC["tracking"][0] == "csv" and CC["example"][0] == "yes"


@pytest.mark.parametrize("name", sorted(CC["_presets"]))
def test_preset_is_complete_and_consistent(name: str) -> None:
    preset = CC["_presets"][name]
    assert set(preset) == PRESET_KEYS
    partitions = preset["partitions"]
    assert preset["batch_partition"] in partitions
    assert preset["interactive_partition"] in partitions
    for limits in partitions.values():
        assert set(limits) == PARTITION_KEYS
        assert rules.parse_time(limits["max_time"]) is not None
        assert limits["gpus_per_node"] >= 1
        assert limits["cpus_per_node"] >= limits["gpus_per_node"]
        assert limits["gpu_type"] or not preset["gpu_type_required"]
        # The memory ceiling: a per-node Slurm size, or empty where no source gives one.
        ceiling = limits["node_memory"]
        assert ceiling == "" or re.fullmatch("[1-9][0-9]*[MGT]", ceiling), ceiling
    for part, limits in partitions.items():  # the default memory fits a node's GPUs, all of them
        full = {"cluster": name, "partition": part, "gpus_per_node": limits["gpus_per_node"]}
        assert rules.check("memory", preset["default_memory"], full, CC["_presets"]) == ""
        assert rules.parse_time(preset["default_time"]) <= rules.parse_time(limits["max_time"])
    assert "{count}" in preset["gpu_request"]
    assert rules.check("memory", preset["default_memory"], {}, {}) == ""
