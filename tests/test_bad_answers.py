"""Bad answers: cookiecutter and copier reject each with the same one-line rule, write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engines import bake, rules

ROOT = Path(__file__).resolve().parent.parent
PRESETS = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["_presets"]

# (answers, the field whose rule must fire)
BAD: list[tuple[dict[str, str], str]] = [
    ({"project_name": "", "project_slug": "ok_slug"}, "project_name"),
    ({"project_name": "line one\nline two", "project_slug": "ok_slug"}, "project_name"),
    ({"project_name": "x" * 201, "project_slug": "long"}, "project_name"),
    ({"project_slug": "1st_model"}, "project_slug"),
    ({"project_slug": "My_Model"}, "project_slug"),
    ({"project_slug": "my-model"}, "project_slug"),
    ({"project_slug": "my model"}, "project_slug"),
    ({"project_slug": "class"}, "project_slug"),
    ({"project_slug": "match"}, "project_slug"),
    ({"project_slug": "json"}, "project_slug"),
    ({"project_slug": "logging"}, "project_slug"),
    ({"project_slug": "torch"}, "project_slug"),
    ({"project_slug": "tqdm"}, "project_slug"),
    ({"project_slug": "_private"}, "project_slug"),
    ({"project_slug": "a" * 51}, "project_slug"),
    ({"project_name": "Ünïcödé Ñame", "project_slug": "ünï"}, "project_slug"),
    ({"description": "two\nlines"}, "description"),
    ({"description": "tab\tseparated"}, "description"),
    ({"author_name": ""}, "author_name"),
    ({"author_email": "jane"}, "author_email"),
    ({"author_email": "jane@"}, "author_email"),
    ({"author_email": "jane@example"}, "author_email"),
    ({"author_email": "jane doe@example.org"}, "author_email"),
    ({"author_email": 'j"ane@example.org'}, "author_email"),
    ({"account": "my account"}, "account"),
    ({"account": "acc;rm -rf ~"}, "account"),
    ({"account": "$(whoami)"}, "account"),
    ({"partition": "bad part"}, "partition"),
    ({"partition": "grete,"}, "partition"),
    ({"partition": "gpu'"}, "partition"),
    ({"partition": "gpu|other"}, "partition"),
    ({"nodes": "0"}, "nodes"),
    ({"nodes": "two"}, "nodes"),
    ({"nodes": "-1"}, "nodes"),
    ({"nodes": "1025"}, "nodes"),
    ({"gpus_per_node": "0"}, "gpus_per_node"),
    ({"gpus_per_node": "9"}, "gpus_per_node"),
    ({"partition": "grete", "gpus_per_node": "5"}, "gpus_per_node"),
    ({"gpus_per_node": "abc"}, "gpus_per_node"),
    ({"cluster": "generic", "gpus_per_node": "9"}, "gpus_per_node"),
    ({"cpus_per_gpu": "0"}, "cpus_per_gpu"),
    ({"cpus_per_gpu": "1.5"}, "cpus_per_gpu"),
    ({"memory": "lots"}, "memory"),
    ({"memory": "64 G"}, "memory"),
    ({"memory": "64GB"}, "memory"),
    ({"memory": "-1G"}, "memory"),
    ({"time_limit": "25:99"}, "time_limit"),
    ({"time_limit": "1-24:00:00"}, "time_limit"),
    ({"time_limit": "1:2:3:4"}, "time_limit"),
    ({"time_limit": "3-00:00:00"}, "time_limit"),
    ({"time_limit": "0:30"}, "time_limit"),
    ({"time_limit": "12:00:00 --wrap=x"}, "time_limit"),
    ({"time_limit": "12:00:00\u00a0"}, "time_limit"),  # a non-breaking space, pasted
    ({"nodes": "\u0662"}, "nodes"),  # an Arabic-Indic digit two
    ({"nodes": " 2"}, "nodes"),
    ({"python_version": "3.10", "snakemake": "yes"}, "snakemake"),
    ({"cluster": "generic", "time_limit": "8-00:00:00"}, "time_limit"),
    ({"mail": "me"}, "mail"),
    ({"mail": "me@x.org;reboot"}, "mail"),
]
# Choice questions are checked by each engine itself, with its own wording.
BAD_CHOICES = [
    ("license", "GPL"),
    ("python_version", "3.9"),
    ("cluster", "summit"),
    ("environment", "docker"),
    ("tracking", "neptune"),
    ("ci", "jenkins"),
]


def test_table_is_large_enough() -> None:
    assert len(BAD) + len(BAD_CHOICES) >= 40


@pytest.mark.parametrize(
    ("answers", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)]
)
@pytest.mark.parametrize("engine", ["cookiecutter", "copier"])
def test_bad_answer_rejected_by_rule(
    engine: str, answers: dict[str, str], field: str, template: Path, tmp_path: Path
) -> None:
    context = {"cluster": "grete", "partition": PRESETS["grete"]["batch_partition"], **answers}
    if "partition" not in answers and answers.get("cluster") == "generic":
        context["partition"] = "gpu"
    expected = rules.check(field, answers[field], context, PRESETS)
    assert expected, f"the rule itself accepts {answers[field]!r}"
    if answers.get("cluster") == "generic" and "partition" not in answers:
        answers = {**answers, "partition": "gpu"}
    result = bake(engine, template, tmp_path / "out", answers)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr[-2000:]
    if engine == "copier":
        assert f"Validation error for question '{field}'" in result.stderr
    else:
        assert f"ERROR: {expected}" in result.stderr
    assert list((tmp_path / "out").iterdir()) == [], "a rejected answer left files behind"


@pytest.mark.parametrize(("field", "value"), BAD_CHOICES)
@pytest.mark.parametrize("engine", ["cookiecutter", "copier"])
def test_bad_choice_rejected(
    engine: str, field: str, value: str, template: Path, tmp_path: Path
) -> None:
    result = bake(engine, template, tmp_path / "out", {field: value})
    assert result.returncode != 0
    assert field in result.stderr and value in result.stderr
    assert list((tmp_path / "out").iterdir()) == []
