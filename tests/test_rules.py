"""The answer rules as functions: Slurm times, slugs, presets, the shell-safety net."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engines import rules
from slugify import slugify

ROOT = Path(__file__).resolve().parent.parent
PRESETS = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["_presets"]
GRETE = {"cluster": "grete", "partition": "grete"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),  # M
        ("30:15", 1815),  # M:S
        ("2:00:00", 7200),  # H:M:S
        ("48:00:00", 172800),  # H:M:S beyond a day is legal
        ("1-0", 86400),  # D-H
        ("1-12", 129600),
        ("1-02:30", 95400),  # D-H:M
        ("2-00:00:00", 172800),  # D-H:M:S
        ("0-00:05:00", 300),
    ],
)
def test_every_slurm_time_format_parses(text: str, seconds: int) -> None:
    assert rules.parse_time(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "1:2:3:4", "25:99", "1-24", "1-1:60", "abc", "-5", "1.5", "1-", "1- 2"]
)
def test_malformed_times_are_rejected(text: str) -> None:
    assert rules.parse_time(text) is None


def test_time_limit_is_checked_against_the_partition_maximum() -> None:
    assert rules.check("time_limit", "2-00:00:00", GRETE, PRESETS) == ""
    message = rules.check("time_limit", "2-00:00:01", GRETE, PRESETS)
    assert message.startswith("time_limit '2-00:00:01'") and "2-00:00:00" in message
    # A partition the preset does not declare has no known maximum: only the syntax counts.
    assert (
        rules.check("time_limit", "9-00:00:00", {"cluster": "grete", "partition": "mine"}, PRESETS)
        == ""
    )


def test_gpus_are_checked_against_the_preset_node() -> None:
    assert rules.check("gpus_per_node", "4", GRETE, PRESETS) == ""
    assert "4 GPUs per node" in rules.check("gpus_per_node", "5", GRETE, PRESETS)
    generic = {"cluster": "generic", "partition": "gpu"}
    assert rules.check("gpus_per_node", "8", generic, PRESETS) == ""


@pytest.mark.parametrize(
    "name",
    [
        "My HPC Project",
        "Über Net 2",
        "  spaced  out  ",
        "Jane's model",
        "a-b-c",
        "CamelCase Thing",
        "x__y",
    ],
)
def test_copier_slug_filter_matches_cookiecutter_slugify(name: str) -> None:
    assert rules.to_slug(name) == slugify(name, separator="_")


def test_valid_defaults_pass_every_rule() -> None:
    answers = {
        k: v
        for k, v in json.loads((ROOT / "cookiecutter.json").read_text()).items()
        if not k.startswith("_")
    }
    answers |= {
        "project_slug": "my_hpc_project",
        "partition": "grete",
        "cpus_per_gpu": "8",
        "memory": "64G",
        "time_limit": "12:00:00",
        "cluster": "grete",
    }
    answers = {k: v[0] if isinstance(v, list) else v for k, v in answers.items()}
    assert rules.validate(answers, PRESETS) == []


def test_messages_are_one_line_and_name_field_and_value() -> None:
    for field, value in [("memory", "lots"), ("project_slug", "class"), ("mail", "x@")]:
        message = rules.check(field, value, GRETE, PRESETS)
        assert "\n" not in message and message.startswith(f"{field} {value!r}:")
