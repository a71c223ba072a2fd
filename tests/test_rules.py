"""The answer rules as functions: Slurm times, slugs, presets, the shell-safety net."""

from __future__ import annotations

import json
import keyword
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engines import module_at, rules
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


# ----------------------------------------------------------- characters, choices, names

_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def test_invisible_characters_over_all_of_unicode() -> None:
    """Every code point: hidden exactly when its category hides text, it cannot be encoded,
    it is default-ignorable (Unicode's own property, read here through the regex package)
    or it is a blank glyph; every other character of every category is allowed."""
    import regex  # noqa: PLC0415 (the oracle of this test only)

    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    wrong, seen = [], Counter()
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        category = unicodedata.category(char)
        expected = (
            category in _HIDDEN_CATEGORIES
            or bool(ignorable.match(char))
            or code in rules.BLANK_GLYPHS
        )
        if rules.is_invisible(char) != expected:
            wrong.append(f"U+{code:04X} {category}")
        seen[category, expected] += 1
    assert wrong == []
    # whole categories: all surrogates and controls refused, letters and digits kept
    for category in ("Cs", "Cc", "Zl", "Zp", "Cf"):
        assert seen[category, False] == 0 and seen[category, True] > 0
    for category in ("Lu", "Ll", "Nd", "Sm", "Pd"):
        assert seen[category, True] == 0 and seen[category, False] > 0


@pytest.mark.parametrize("blank", ["\u3164", "\u115f", "\u1160", "\uffa0", "\u2800", "\ud800"])
def test_blank_and_unencodable_characters_are_refused_in_text(blank: str) -> None:
    for field in ("author_name", "description", "project_name"):
        message = rules.check(field, f"Jane{blank}", GRETE, PRESETS)
        assert f"U+{ord(blank):04X}" in message
    assert rules.check("author_name", blank, GRETE, PRESETS).startswith("author_name ")


def test_choices_come_from_cookiecutter_json_and_name_the_allowed_values() -> None:
    cc = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
    lists = {k: tuple(v) for k, v in cc.items() if isinstance(v, list) and not k.startswith("_")}
    assert lists == rules.CHOICES
    answers = {**GRETE, "python_version": "3.11"}
    for field, allowed in lists.items():
        for value in allowed:
            assert rules.check(field, value, answers, PRESETS) == "", (field, value)
        message = rules.check(field, "nonexistent", answers, PRESETS)
        assert message == f"{field} 'nonexistent': must be one of " + ", ".join(allowed)


@pytest.mark.parametrize(
    ("slug", "refused_in"),
    [
        ("distutils", {"3.10", "3.11"}),
        ("imp", {"3.10", "3.11"}),
        ("tomllib", {"3.11", "3.12", "3.13"}),
        ("telnetlib", {"3.10", "3.11", "3.12"}),
        ("type", {"3.12", "3.13"}),  # a soft keyword since 3.12
        ("match", {"3.10", "3.11", "3.12", "3.13"}),
        ("json", {"3.10", "3.11", "3.12", "3.13"}),
    ],
)
def test_slug_names_are_those_of_the_projects_python(slug: str, refused_in: set[str]) -> None:
    for version in rules.KEYWORDS:
        message = rules.check("project_slug", slug, {**GRETE, "python_version": version}, PRESETS)
        assert bool(message) == (version in refused_in), (version, message)


def test_the_version_tables_agree_with_this_python() -> None:
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert rules.KEYWORDS[host] == {*keyword.kwlist, *keyword.softkwlist}
    slug_shaped = {n for n in sys.stdlib_module_names if re.fullmatch("[a-z][a-z0-9_]*", n)}
    in_table = {n for n in slug_shaped if rules.python_names(n, host)}
    assert in_table == slug_shaped


@pytest.mark.parametrize("name", ["con", "aux", "nul", "prn", "com1", "com9", "lpt1", "lpt9"])
def test_windows_device_names_are_refused_as_slugs(name: str) -> None:
    assert "device name on Windows" in rules.check("project_slug", name, GRETE, PRESETS)
    for spelled in (name.upper(), name.title() + ".txt", f"{name}.tar.gz"):
        assert rules._WINDOWS_DEVICE.fullmatch(spelled)
    assert rules.check("project_slug", f"{name}_net", GRETE, PRESETS) == ""


def test_an_emoji_only_name_is_reported_on_the_field_typed() -> None:
    answers = {**GRETE, "project_name": "\U0001f680\U0001f525"}
    for field, value in (("project_name", answers["project_name"]), ("project_slug", "")):
        message = rules.check(field, value, answers, PRESETS)
        assert message.startswith("project_name '") and "project_slug" in message


# ------------------------------------------------------------------ resources


@pytest.mark.parametrize(
    ("field", "value", "part"),
    [
        ("memory", "0G", "more than 0"),
        ("memory", "0G/gpu", "more than 0"),
        ("gpu_type", "H100", "grete (A100)"),  # an H100 type on an A100 partition
        ("gpu_type", "99", "such as A100"),
        ("account", "a" * 129, "at most 128"),
        ("partition", "p" * 129, "at most 128"),
        ("gpu_type", "A" * 129, "at most 128"),
        ("mail", "m" * 120 + "@example.org", "at most 128"),
        ("author_email", "a" * 250 + "@x.org", "at most 254"),
    ],
)
def test_resource_answers_are_bounded(field: str, value: str, part: str) -> None:
    message = rules.check(field, value, GRETE, PRESETS)
    assert message.startswith(f"{field} ") and part in message


def test_gpu_type_of_the_partition_passes() -> None:
    assert rules.check("gpu_type", "A100", GRETE, PRESETS) == ""
    h100 = {"cluster": "grete", "partition": "grete-h100"}
    assert rules.check("gpu_type", "H100", h100, PRESETS) == ""
    unknown = {"cluster": "grete", "partition": "mine"}  # not in the preset: any type
    assert rules.check("gpu_type", "L40S", unknown, PRESETS) == ""


# A site whose preset knows its nodes' memory (no shipped preset does yet: no source gives
# Grete's): "big" nodes hold 512G, "small" ones 190000M; "open" is unknown.
SITE = {
    "site": {
        "partitions": {
            "big": {"gpus_per_node": 4, "cpus_per_node": 64, "node_memory": "512G"},
            "small": {"gpus_per_node": 4, "cpus_per_node": 64, "node_memory": "190000M"},
            "open": {"gpus_per_node": 4, "cpus_per_node": 64, "node_memory": ""},
        }
    }
}


@pytest.mark.parametrize(
    ("memory", "partition", "gpus", "refused"),
    [
        ("512G", "big", "1", ""),  # a whole node
        ("513G", "big", "1", "exceeds the 512G of a node of partition big in preset site"),
        ("1T", "big", "4", "exceeds the 512G"),
        ("536870912K", "big", "1", ""),  # 512G in KiB
        ("536870913K", "big", "1", "exceeds the 512G"),
        ("128G/gpu", "big", "4", ""),
        ("129G/gpu", "big", "4", "(516G for 4 GPUs)"),  # per GPU, times the GPUs
        ("129G/gpu", "big", "1", ""),
        ("185G", "small", "1", ""),  # 189440M
        ("186G", "small", "1", "exceeds the 190000M"),  # 190464M
        ("190000M", "small", "1", ""),
        ("190001M", "small", "1", "exceeds the 190000M"),
        ("200G", "big,small", "1", "partition small"),  # a list: every partition's node
        ("9999T", "open", "4", ""),  # unknown: no ceiling
        ("9999T", "elsewhere", "4", ""),  # not in the preset
    ],
)
def test_memory_is_at_most_a_node_of_the_partition(
    memory: str, partition: str, gpus: str, refused: str
) -> None:
    answers = {"cluster": "site", "partition": partition, "gpus_per_node": gpus}
    message = rules.check("memory", memory, answers, SITE)
    if refused:
        assert message.startswith(f"memory '{memory}': ") and refused in message, message
    else:
        assert message == ""


# ------------------------------------------------------------------ routes (no engine)

CC = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
HOSTILE = "x{{ cycler.__init__.__globals__.os.popen('id').read() }}"


def test_config_files_may_set_answers_only() -> None:
    """What the pre-prompt hook refuses in a config file's default_context, every class."""
    context = {
        "description": HOSTILE,
        "author_name": "Jane\u3164",  # a blank Hangul filler
        "license": ["MIT", "{% raw %}"],  # a list item
        "cluster": {"grete": {"note": "{# c #}"}},  # a nested value
        "tracking": {"{{ 1 }}": "x"},  # a dictionary key: cookiecutter renders keys too
        "_extensions": [],  # switches the rules off
        "_template_version": "9.9.9",
        "__gpu_type": "A100",
        "project_name": "Fine Name",
        "nodes": 2,
        "git_init": True,  # YAML's yes: no choice is true
        "mail": None,
        "full_name": "Another template's answer",
    }
    fields = [m.split(" ", 1)[0] for m in rules.check_config(context)]
    assert fields == ["description", "author_name", "license", "cluster", "tracking",
                      "_extensions", "_template_version", "__gpu_type", "git_init"]  # fmt: skip
    assert rules.check_config({"project_name": "Fine", "author_name": "Jane Doe"}) == []


PRE_PROMPT = ROOT / "hooks" / "pre_prompt.py"


def _pre_prompt() -> Any:
    return module_at(PRE_PROMPT, "pre_prompt_under_test")


CLI = ["/v/bin/python", "/v/bin/cookiecutter"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*CLI, "--config-file", "c.yaml", "t"], ("c.yaml", False, {})),
        ([*CLI, "--config-file=/a/c.yaml", "."], ("/a/c.yaml", False, {})),
        (["python", "-m", "cookiecutter", "--config-file", "c.yaml", "."], ("c.yaml", False, {})),
        (["python", "-m", "cookiecutter.__main__", "--config-file", "c", "."], ("c", False, {})),
        ([*CLI, "--default-config", "--config-file", "c", "."], ("c", True, {})),
        ([*CLI, ".", "--", "--config-file", "c"], (None, False, {})),
        # answers after the template; option values (even with '=') are none
        ([*CLI, "-o", "a=b", "t", "ci=no", "x=y=z"], (None, False, {"ci": "no", "x": "y=z"})),
        ([*CLI, "--no-input", "t", "--checkout", "v1", "ci=none"], (None, False, {"ci": "none"})),
        # another program's option of that name (pytest has one) is not cookiecutter's
        (["/v/bin/python", "/v/bin/pytest", "--config-file", "pytest.ini"], (None, False, {})),
        ([], (None, False, {})),
    ],
)  # fmt: skip
def test_pre_prompt_hook_reads_cookiecutters_command_line(
    argv: list[str], expected: tuple[str | None, bool, dict[str, str]]
) -> None:
    command = _pre_prompt().cookiecutter_command(argv)
    assert (command.config_file, command.default_config, command.extra) == expected


def test_pre_prompt_hook_finds_the_config_cookiecutter_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order of cookiecutter.config.get_user_config: default, file, variable, rc file."""
    hook = _pre_prompt()

    def found(*argv: str) -> Path | None:
        return hook.config_path(hook.cookiecutter_command(["py", "cookiecutter", *argv]))

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PWD", str(tmp_path / "start"))
    monkeypatch.delenv("COOKIECUTTER_CONFIG", raising=False)
    assert found() is None  # no rc file
    (tmp_path / ".cookiecutterrc").write_text("default_context: {}\n", "utf-8")
    assert found() == tmp_path / ".cookiecutterrc"
    monkeypatch.setenv("COOKIECUTTER_CONFIG", str(tmp_path / "env.yaml"))
    assert found() == tmp_path / "env.yaml"
    monkeypatch.setenv("COOKIECUTTER_CONFIG", "env.yaml")  # relative: to where it started
    assert found() == tmp_path / "start" / "env.yaml"
    assert found("--config-file", "c.yaml") == tmp_path / "start" / "c.yaml"
    assert found("--config-file", "c.yaml", "--default-config") is None
    missing = hook.config_errors(tmp_path / "missing.yaml")
    assert len(missing) == 1 and "cannot find the config file" in missing[0]
    for text in ("", "abbreviations: {}\n", "default_context:\n", "[1, 2]\n"):
        (tmp_path / "c.yaml").write_text(text, "utf-8")
        assert hook.config_errors(tmp_path / "c.yaml") == [], text
    (tmp_path / "c.yaml").write_text("default_context: [license]\n", "utf-8")
    listed = f"default_context: must be a mapping of answers (config file {tmp_path}/c.yaml)"
    assert hook.config_errors(tmp_path / "c.yaml") == [listed]


@pytest.mark.parametrize(
    ("given", "rule"),
    [
        ({"license": "GPL-3.0"}, "must be one of MIT, BSD-3-Clause, Apache-2.0, proprietary"),
        ({"python_version": 3.12}, "is read by YAML as float, not text: write '3.12' in quotes"),
        ({"vscode": False}, "is read by YAML as bool, not text: write 'no' in quotes"),
        ({"example": 1}, "must be one of yes, no"),  # 1 is no 'yes'
        ({"ci": ["github"]}, "must be one of gitlab, github, none"),
        ({"cluster": None}, "must be one of grete, generic"),
    ],
)
def test_choices_from_a_config_are_compared_as_the_engine_does(
    given: dict[str, Any], rule: str
) -> None:
    """cookiecutter keeps the first choice for any of these (a warning, or a traceback)."""
    [(field, value)] = given.items()
    assert rules.check_choices(given) == [f"{field} {str(value)!r}: {rule}"]
    assert rules.check_config(given) == rules.check_choices(given)
    assert rules.check_choices({"license": "MIT", "vscode": "no", "project_name": "x"}) == []


def test_values_differing_from_the_template_are_checked_before_rendering() -> None:
    context = {k: v for k, v in CC.items() if k != "__prompts__"}
    assert rules.check_given(context, CC) == []
    tampered = {
        **context,
        "description": HOSTILE,
        "_project_owned": [],
        "_presets": {},
        "__mem_per_node": "{{ 1 }}",
        "project_name": ["a"],
        "nodes": 2,
    }
    fields = [m.split(" ", 1)[0].rstrip(":") for m in rules.check_given(tampered, CC)]
    assert fields == ["_presets", "_project_owned", "project_name", "description",
                      "__mem_per_node"]  # fmt: skip


def test_replayed_options_are_refused() -> None:
    answers = {
        "project_name": "P",
        "project_slug": "p_net",
        "_extensions": CC["_extensions"],
        "_template": "x",
        "_copy_without_render": ["*"],  # the template's option, with another value
        "_new_lines": "\r\n",  # an engine option the template does not set
        "_template_version": "9.9.9",
    }
    messages = rules.check_rendered(answers, CC)
    refused = {m.split(" ", 1)[0] for m in messages}
    assert refused == {"_template_version", "_copy_without_render", "_new_lines"}, messages


def test_an_option_a_later_release_adds_is_judged_by_its_template() -> None:
    """cruft update renders the new release with the rules of the project's release."""
    answers = {
        "project_name": "P",
        "project_slug": "p_net",
        "_extensions": CC["_extensions"],
        "_a_later_option": ["tests"],
    }
    later = {**CC, "_a_later_option": ["tests"]}
    assert rules.check_rendered(answers, later) == []
    messages = rules.check_rendered({**answers, "_a_later_option": ["*"]}, later)
    assert [m.split(" ", 1)[0] for m in messages] == ["_a_later_option"]
    assert [m.split(" ", 1)[0] for m in rules.check_rendered(answers, CC)] == ["_a_later_option"]


def test_template_options_list_is_complete() -> None:
    options = [k for k in CC if k.startswith("_") and not k.startswith("__")]
    assert sorted(options) == sorted(rules.TEMPLATE_OPTIONS)
    assert CC["_extensions"] == rules.EXTENSIONS
