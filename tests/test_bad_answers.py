"""Bad answers: every engine rejects each with the same one-line rule and writes nothing.

The table holds every class of careless or hostile answer found so far: malformed values,
shell metacharacters, invisible characters, template syntax, slugs that would break the
project, addresses setuptools or git refuse, and values too long to repeat. Private values
(presets, derived keys, copier's hidden questions) have their own table: each engine passes
them its own way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
from engines import Bake, bake, module_at, rules

ROOT = Path(__file__).resolve().parent.parent
PRESETS = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["_presets"]

# (answers, the field whose rule must fire)
BAD: list[tuple[dict[str, str], str]] = [
    ({"project_name": "", "project_slug": "ok_slug"}, "project_name"),
    ({"project_name": "\u00a0"}, "project_name"),  # the slug derived from it says the same
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
    ({"memory": "64"}, "memory"),  # a bare number: megabytes to Slurm
    ({"memory": "16G/node"}, "memory"),
    ({"partition": "scc-gpu"}, "gpu_type"),  # not in the preset: no known GPU type
    ({"partition": "grete,grete-h100"}, "gpu_type"),  # A100 and H100
    ({"gpu_type": "A100:1"}, "gpu_type"),
    ({"cpus_per_gpu": "100"}, "cpus_per_gpu"),
    ({"partition": "grete-h100", "cpus_per_gpu": "25"}, "cpus_per_gpu"),
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
    # Invisible characters: line and paragraph separators end a YAML comment; bidirectional
    # controls and zero-width characters hide or reorder text.
    ({"project_name": "Net\u2028ci_job:", "project_slug": "net"}, "project_name"),
    ({"project_name": "Net\u2029x", "project_slug": "net"}, "project_name"),
    ({"project_name": "Net \u202egnp.exe", "project_slug": "net"}, "project_name"),
    ({"description": "zero\u200bwidth"}, "description"),
    ({"description": "joined\u200d"}, "description"),
    ({"description": "\ufeffBOM first"}, "description"),
    ({"author_name": "Jane\u2066 Doe"}, "author_name"),
    ({"author_name": "Jane\u200f Doe"}, "author_name"),
    ({"description": "bell\x07"}, "description"),
    ({"account": "acc\u200b"}, "account"),
    # Template syntax that renders cleanly: cookiecutter would render it, copier keep it.
    ({"author_name": "{{ cookiecutter.project_name }}"}, "author_name"),
    ({"description": "{% if true %}x{% endif %}"}, "description"),
    ({"project_name": "Net {# note #}", "project_slug": "net"}, "project_name"),
    ({"description": "{{ 7 * 7 }}"}, "description"),
    # Slugs that break the project: CPython's test package, pytest's files, the dependency
    # closure (dependencies of dependencies too) and the project's own folders.
    ({"project_slug": "test"}, "project_slug"),
    ({"project_slug": "conftest"}, "project_slug"),
    ({"project_slug": "sitecustomize"}, "project_slug"),
    ({"project_slug": "sympy"}, "project_slug"),
    ({"project_slug": "pyparsing"}, "project_slug"),
    ({"project_slug": "torchgen"}, "project_slug"),
    ({"project_slug": "networkx"}, "project_slug"),
    ({"project_slug": "filelock"}, "project_slug"),
    ({"project_slug": "triton"}, "project_slug"),
    ({"project_slug": "tests"}, "project_slug"),
    ({"project_slug": "src"}, "project_slug"),
    ({"project_slug": "logs"}, "project_slug"),
    ({"project_slug": "a/b"}, "project_slug"),
    # Accepted before, refused later by setuptools or git.
    ({"author_email": ".a..b@example.org"}, "author_email"),
    ({"author_email": "a.@example.org"}, "author_email"),
    ({"author_email": "a..b@example.org"}, "author_email"),
    ({"author_email": "a@-x.org"}, "author_email"),
    ({"author_email": "a@x-.org"}, "author_email"),
    ({"mail": "me@x..org"}, "mail"),
    ({"author_name": "."}, "author_name"),
    ({"author_name": ", ;"}, "author_name"),
    ({"author_name": "Jane <jane@x.org>"}, "author_name"),
    # Too long to repeat: the message shows the start and the length.
    ({"project_name": "N" * 10_000}, "project_name"),
    ({"description": "d" * 5_000}, "description"),
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
@pytest.mark.parametrize("engine", ["cookiecutter", "copier", "cruft"])
def test_bad_answer_rejected_by_rule(
    engine: str, answers: dict[str, str], field: str, template: Path, tmp_path: Path
) -> None:
    context = {"cluster": "grete", "partition": PRESETS["grete"]["batch_partition"], **answers}
    if "partition" not in answers and answers.get("cluster") == "generic":
        context["partition"] = "gpu"
    # gpu_type is rejected for its default (empty) when the partition has no known type.
    value = answers.get(field, "")
    expected = rules.check(field, value, context, PRESETS)
    assert expected, f"the rule itself accepts {value!r}"
    if answers.get("cluster") == "generic" and "partition" not in answers:
        answers = {**answers, "partition": "gpu"}
    result = bake(engine, template, tmp_path / "out", answers)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr[-2000:]
    assert len(expected) < 200, "a message repeats a long value in full"
    shown = str(answers.get(field, ""))  # the field may be judged by another answer
    assert len(shown) <= rules.MAX_SHOWN or shown not in result.stderr
    assert result.stderr.count(f"ERROR: {expected}") == 1
    if engine == "copier":  # the rule's line last, no traceback before it
        assert result.stderr.strip().splitlines()[-1] == f"ERROR: {expected}"
        assert "Traceback" not in result.stderr
    assert list((tmp_path / "out").iterdir()) == [], "a rejected answer left something behind"


@pytest.mark.parametrize(("field", "value"), BAD_CHOICES)
@pytest.mark.parametrize("engine", ["cookiecutter", "copier", "cruft"])
def test_bad_choice_rejected(
    engine: str, field: str, value: str, template: Path, tmp_path: Path
) -> None:
    result = bake(engine, template, tmp_path / "out", {field: value})
    assert result.returncode != 0
    assert field in result.stderr and value in result.stderr
    assert list((tmp_path / "out").iterdir()) == []
    if engine == "cookiecutter":  # the pre-prompt hook's line, not the engine's traceback
        expected = f"ERROR: {rules.check_choice(field, value)} (command line)"
        assert result.stderr.strip() == expected


# Private values, given the way each engine lets a user pass them: (engine, answers, message).
GRETE_TAMPERED = {**PRESETS, "grete": {**PRESETS["grete"], "modules": ["cuda\nid>pwned.txt"]}}
PRIVATE: list[tuple[str, dict, str]] = [
    ("cookiecutter", {"__gpu_type": "A100\nid>pwned.txt\n#"}, "ERROR: __gpu_type "),
    ("cookiecutter", {"__gpu_type": "H100"}, "ERROR: __gpu_type 'H100': is derived"),
    ("cookiecutter", {"__mem_per_node": "64G\nid>pwned.txt"}, "ERROR: __mem_per_node "),
    ("cookiecutter", {"__answers": "../../../x"}, "ERROR: __answers '../../../x': is derived"),
    ("cookiecutter", {"__answers": ".cruft.json"}, "ERROR: __answers '.cruft.json': is derived"),
    ("cruft", {"__gpu_type": "A100\nid>pwned.txt\n#"}, "ERROR: __gpu_type "),
    ("cruft", {"__answers": "../x"}, "ERROR: __answers '../x': is derived"),
    ("cookiecutter", {"__year": "2999"}, "ERROR: __year '2999': is derived"),
    ("cruft", {"__year": "2020 Evil Corp"}, "ERROR: __year '2020 Evil Corp': is derived"),
    ("cruft", {"_presets": GRETE_TAMPERED}, "ERROR: _presets: is the template's cluster data"),
    ("cookiecutter", {"__year": "2026\nid"}, "ERROR: __year '2026\\nid': is derived"),
    ("copier", {"presets": json.dumps(GRETE_TAMPERED)}, "presets: is the template's cluster data"),
    ("copier", {"presets": "{}"}, "presets: is the template's cluster data"),
    ("copier", {"cookiecutter": json.dumps({"account": "a\nb"})}, "cookiecutter: is computed"),
    ("copier", {"cookiecutter": "{}"}, "cookiecutter: is computed"),
]


@pytest.mark.parametrize(
    ("engine", "answers", "message"),
    PRIVATE,
    ids=[f"{e}-{i}" for i, (e, _, _) in enumerate(PRIVATE)],
)
def test_private_values_cannot_be_given(
    engine: str, answers: dict, message: str, template: Path, tmp_path: Path
) -> None:
    result = bake(engine, template, tmp_path / "out", answers)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert list((tmp_path / "out").iterdir()) == [], "a rejected answer left files behind"


@pytest.mark.parametrize(
    "answers",
    [
        {"author_name": "{{ nobody.knows }}"},  # cookiecutter used to dump its whole context
        {"description": "{% if %}"},  # a syntax error in the answer
        {"project_name": "{{ cookiecutter.x.y }}", "project_slug": "ok"},
        {"project_slug": "a/b/c"},  # cookiecutter used to make out/a/b before any rule ran
        {"project_slug": "s" * 300},  # ... and fail with "File name too long"
        {"project_slug": "../escaped"},
    ],
    ids=["undefined", "syntax-error", "nested-undefined", "path", "too-long", "parent"],
)
@pytest.mark.parametrize("engine", ["cookiecutter", "copier", "cruft"])
def test_rejected_before_the_engine_renders_or_writes(
    engine: str, answers: dict[str, str], template: Path, tmp_path: Path
) -> None:
    """The rule's one line, whatever the engine would do with the answer first."""
    field = next(iter(answers))
    temp = tmp_path / "temp"
    temp.mkdir()
    result = bake(engine, template, tmp_path / "out", answers, TMPDIR=str(temp))
    assert result.returncode != 0
    assert f"{field} " in result.stderr, result.stderr[-2000:]
    if engine != "copier":  # copier frames its message in its own words, over a few lines
        expected = rules.check(field, answers[field], answers, PRESETS)
        assert result.stderr.strip().splitlines() == [f"ERROR: {expected}"]
        assert result.stdout.strip() == ""
    assert sorted(tmp_path.iterdir()) == [tmp_path / "out", temp], "written beside the output"
    assert list((tmp_path / "out").iterdir()) == []
    assert list(temp.iterdir()) == [], "a copy of the template left in the temporary folder"


@pytest.mark.parametrize(
    ("name", "slug"),
    [("Straße Modell", "strasse_modell"), ("Δέλτα Net", "delta_net"), ("Café Lab", "cafe_lab")],
)
@pytest.mark.parametrize("engine", ["cookiecutter", "copier", "cruft"])
def test_non_ascii_names_give_one_slug_in_every_engine(
    engine: str, name: str, slug: str, template: Path, tmp_path: Path
) -> None:
    result = bake(engine, template, tmp_path / "out", {"project_name": name})
    assert result.ok, result.stderr[-2000:]
    assert (result.project / "src" / slug / "__init__.py").is_file()


def test_a_long_name_gives_a_slug_within_the_limit(template: Path, tmp_path: Path) -> None:
    default = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["project_slug"]
    assert f"max_length={rules.MAX_SLUG}" in default
    name = "A Very Long Project Name About Learned Surrogates For Ocean Heat Transport"
    result = bake("cookiecutter", template, tmp_path / "out", {"project_name": name})
    assert result.ok, result.stderr[-2000:]
    assert len(result.project.name) <= rules.MAX_SLUG
    assert (result.project / "src" / result.project.name).is_dir()


@pytest.mark.parametrize("slug", ["build", "dist"])
def test_slugs_named_like_build_folders_are_committed(
    slug: str, template: Path, tmp_path: Path
) -> None:
    """Ignore rules are anchored at the root: src/build is tracked in the first commit."""
    result = bake("cookiecutter", template, tmp_path / "out", {"project_slug": slug})
    assert result.ok, result.stderr[-2000:]
    tracked = subprocess.run(
        ["git", "ls-files", f"src/{slug}"],
        cwd=result.project,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert f"src/{slug}/__init__.py" in tracked and f"src/{slug}/cli.py" in tracked


def test_default_bake_leaves_no_empty_folders(default_bake: Bake) -> None:
    root = default_bake.project
    empty = [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_dir() and ".git" not in p.parts and not any(p.iterdir())
    ]
    assert empty == []


def test_a_failed_first_commit_leaves_no_repository(tmp_path: Path) -> None:
    """All or nothing: git refusing the identity leaves no half-made repository behind."""
    post_gen = module_at(ROOT / "hooks" / "post_gen_project.py", "post_gen")
    (tmp_path / "file.txt").write_text("x\n")
    outcome = post_gen.first_commit(tmp_path, ".", "a@example.org")
    assert outcome.startswith("No git repository created: git commit failed")
    assert not (tmp_path / ".git").exists()


def test_placeholder_author_is_the_template_default() -> None:
    post_gen = module_at(ROOT / "hooks" / "post_gen_project.py", "post_gen")
    defaults = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
    assert defaults["author_email"] == post_gen.PLACEHOLDER_EMAIL


def test_generated_hook_data_is_fresh() -> None:
    """The forbidden slugs follow the real dependency closure; the presets fingerprint too."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_hook_data.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert rules.presets_fingerprint(PRESETS) == rules.PRESETS_SHA256


def test_gpu_type_rule_matches_cookiecutter_expression() -> None:
    """The hook recomputes __gpu_type exactly as cookiecutter.json's expression does."""
    expression = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["__gpu_type"]
    for cluster, preset in PRESETS.items():
        for partition in [*preset["partitions"], "unknown", "grete,grete-h100"]:
            for given in ("", "H100"):
                answers = {"cluster": cluster, "partition": partition, "gpu_type": given}
                rendered = jinja2.Template(expression).render(
                    cookiecutter={**answers, "_presets": PRESETS}
                )
                assert rules.gpu_type(answers, PRESETS) == rendered, (cluster, partition, given)


def test_mem_per_node_rule_matches_cookiecutter_expression() -> None:
    """The hook recomputes __mem_per_node exactly as cookiecutter.json's expression does."""
    expression = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))["__mem_per_node"]
    for memory in (
        "64G",
        "500M",
        "16G/gpu",
        "120G/gpu",
        "2T/gpu",
        "x/gpu",
        "/gpu",
        "1.5G/gpu",
        "infG/gpu",
    ):
        for gpus in ("1", "4", "abc", ""):
            answers = {"memory": memory, "gpus_per_node": gpus}
            rendered = jinja2.Template(expression).render(cookiecutter=answers)
            assert rules.mem_per_node(answers) == rendered, (memory, gpus)


# ---------------------------------------------------------------- answers from files
# Each route is tried once per engine with a sample of every class of bad answer at once
# (the classes themselves are tried per rule in test_rules.py). A config file's values are
# rendered by cookiecutter and cruft while they ask: the payload would create MARKER.

MARKER = "pwned-marker"


def _payload(folder: Path) -> str:
    """Template syntax that creates a marker file when it is rendered."""
    command = f"touch {folder / MARKER}"
    return "x{{ cycler.__init__.__globals__.os.popen('" + command + "').read() }}"


def _config(folder: Path, default_context: dict[str, Any]) -> Path:
    """A cookiecutter user config (YAML is a superset of JSON) that keeps replays in folder."""
    path = folder / "config.yaml"
    config = {"replay_dir": str(folder / "replay"), "default_context": default_context}
    path.write_text(json.dumps(config), "utf-8")
    return path


def _run_engine(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **env}
    return subprocess.run(
        args, cwd=cwd, env=environment, capture_output=True, text=True, check=False
    )


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


CONFIG_ROUTES = [
    ("cookiecutter", "--config-file"),
    ("cookiecutter", "COOKIECUTTER_CONFIG"),
    ("cookiecutter", "~/.cookiecutterrc"),
    ("cruft", "--config-file"),
    ("cruft", "COOKIECUTTER_CONFIG"),
    ("cruft", "~/.cookiecutterrc"),
]


def _bake_with_config(
    engine: str, route: str, default_context: dict[str, Any], template: Path, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Bake with a user config on one route: the result, the output folder, the config file."""
    config = _config(tmp_path, default_context)
    out, home = tmp_path / "out", tmp_path / "home"
    out.mkdir()
    home.mkdir()
    env = {"HOME": str(home)}
    args = [_tool(engine)]
    args += ["--no-input", "-o", str(out)] if engine == "cookiecutter" else ["create", "--no-input"]
    args += [] if engine == "cookiecutter" else ["--output-dir", str(out)]
    if route == "--config-file":
        args += ["--config-file", str(config)]
    elif route == "COOKIECUTTER_CONFIG":
        env["COOKIECUTTER_CONFIG"] = str(config)
    else:
        (home / ".cookiecutterrc").write_text(config.read_text("utf-8"), "utf-8")
        config = home / ".cookiecutterrc"
    return _run_engine([*args, str(template)], tmp_path, **env), out, config


@pytest.mark.parametrize(("engine", "route"), CONFIG_ROUTES)
def test_config_file_answers_are_checked_before_rendering(
    engine: str, route: str, template: Path, tmp_path: Path
) -> None:
    bad = {
        "description": _payload(tmp_path),  # template syntax that runs code
        "author_name": "Jane\u3164",  # a blank Hangul filler
        "project_name": "Net\ud800",  # a lone surrogate
        "_template_version": "9.9.9",  # private values and options
        "_project_owned": [],
        "__gpu_type": "A100\nid",
    }
    result, out, _ = _bake_with_config(engine, route, bad, template, tmp_path)
    assert result.returncode != 0
    for field in bad:
        assert f"ERROR: {field} " in result.stderr, (field, result.stderr[-3000:])
    assert not (tmp_path / MARKER).exists(), "a config file's template syntax was rendered"
    assert list(out.iterdir()) == [], "a rejected answer left something behind"


@pytest.mark.parametrize(("engine", "route"), CONFIG_ROUTES)
def test_choices_from_a_config_are_refused(
    engine: str, route: str, template: Path, tmp_path: Path
) -> None:
    """Both engines warn and bake the first choice; the rules refuse, naming the file."""
    bad = {"license": "GPL-3.0", "python_version": 3.12, "vscode": False, "cluster": "nersc"}
    result, out, config = _bake_with_config(engine, route, bad, template, tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR: ")]
    shown = "~/.cookiecutterrc" if route == "~/.cookiecutterrc" and engine == "cruft" else config
    assert errors == [f"ERROR: {m} (config file {shown})" for m in rules.check_choices(bad)]
    assert list(out.iterdir()) == [], "a refused choice left something behind"


@pytest.mark.parametrize(("engine", "route"), CONFIG_ROUTES)
def test_a_config_that_removes_the_rules_runs_no_code(
    engine: str, route: str, template: Path, tmp_path: Path
) -> None:
    """`_extensions: []` and template syntax in one config file.

    cookiecutter: the pre-prompt hook refuses the file before cookiecutter renders a value
    (and removes the template copy cookiecutter made for it). cruft runs no template code
    before it renders the file's values (create, update, check and diff all call
    cruft's generate_cookiecutter_context: get_user_config, generate_context,
    prompt_for_config): the payload runs there, and only the pre-generation hook refuses the
    bake. This test fails when that changes, so the docs can say so.
    """
    bad = {"_extensions": [], "project_name": _payload(tmp_path)}
    config = _config(tmp_path, bad)
    out, home, temp = tmp_path / "out", tmp_path / "home", tmp_path / "temp"
    for folder in (out, home, temp):
        folder.mkdir()
    env = {"HOME": str(home), "TMPDIR": str(temp), "PWD": str(tmp_path)}
    args = [_tool(engine)]
    args += ["--no-input", "-o", str(out)] if engine == "cookiecutter" else ["create", "--no-input"]
    args += [] if engine == "cookiecutter" else ["--output-dir", str(out)]
    if route == "--config-file":  # relative: cookiecutter reads it from where it started
        args += ["--config-file", config.name]
    elif route == "COOKIECUTTER_CONFIG":
        env["COOKIECUTTER_CONFIG"] = config.name  # relative too
    else:
        (home / ".cookiecutterrc").write_text(config.read_text("utf-8"), "utf-8")
        config = home / ".cookiecutterrc"
    result = _run_engine([*args, str(template)], tmp_path, **env)
    assert result.returncode != 0
    assert list(out.iterdir()) == [], "a rejected answer left something behind"
    if engine == "cruft":  # the residual (see the docstring)
        assert (tmp_path / MARKER).exists()
        assert "ERROR: _extensions '[]': is the template's own setting" in result.stderr
        return
    assert not (tmp_path / MARKER).exists(), "a config file's template syntax was rendered"
    expected = [f"ERROR: {m} (config file {config})" for m in rules.check_config(bad)]
    assert [m.split(" ", 2)[1] for m in expected] == ["_extensions", "project_name"]
    assert result.stderr.strip().splitlines() == expected  # the rule's lines, nothing else
    assert result.stdout.strip() == "Pre-Prompt Hook script failed"  # cookiecutter's own
    assert list(temp.iterdir()) == [], "the template copy was left behind"


def _checker_refuses_unrendered(path: Path, kind: str, bad: dict[str, Any], tmp_path: Path) -> None:
    """tools/check_answers.py refuses `path` with the rules' lines and renders none of it."""
    (tmp_path / MARKER).unlink()  # the engine's run made it
    checker = [sys.executable, str(ROOT / "tools" / "check_answers.py"), str(path)]
    checked = _run_engine(checker, tmp_path)
    assert checked.returncode == 1
    expected = [f"ERROR: {m} ({kind} {path})" for m in rules.check_config(bad)]
    assert checked.stderr.splitlines() == expected
    assert not (tmp_path / MARKER).exists(), "the checker rendered the file"


@pytest.mark.parametrize("route", ["--extra-context", "--extra-context-file"])
def test_cruft_extra_context_that_removes_the_rules_runs_first(
    route: str, template: Path, tmp_path: Path
) -> None:
    """The other route no template can close, and the command that checks such a file.

    cruft renders ``--extra-context`` (``-E``) before any template code, so a value there
    that removes the rules runs its template syntax; the pre-generation hook refuses the
    bake after. This test fails when that changes, so the docs can say so.
    tools/check_answers.py refuses the same file without rendering it.
    """
    bad = {"_extensions": [], "project_name": _payload(tmp_path)}
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(bad), "utf-8")
    out = tmp_path / "out"
    out.mkdir()
    given = [route, json.dumps(bad) if route == "--extra-context" else str(extra)]
    args = [_tool("cruft"), "create", "--no-input", "--output-dir", str(out), *given]
    result = _run_engine([*args, str(template)], tmp_path)
    assert result.returncode != 0
    assert list(out.iterdir()) == [], "a rejected answer left something behind"
    assert (tmp_path / MARKER).exists()  # the residual (see the docstring)
    _checker_refuses_unrendered(extra, "answers file", bad, tmp_path)


def test_cookiecutter_without_hooks_renders_a_config_first(template: Path, tmp_path: Path) -> None:
    """The third route no template can close, and the command that checks such a file.

    ``--accept-hooks no`` turns off every hook, the pre-prompt hook that refuses a config file
    before cookiecutter renders its values among them: a file with ``_extensions: []`` and
    template syntax runs it. This test fails when that changes, so the docs can say so.
    tools/check_answers.py refuses the same file without rendering it.
    """
    bad = {"_extensions": [], "project_name": _payload(tmp_path)}
    config = _config(tmp_path, bad)
    out = tmp_path / "out"
    out.mkdir()
    args = [_tool("cookiecutter"), "--no-input", "--accept-hooks", "no", "-o", str(out)]
    _run_engine([*args, "--config-file", str(config), str(template)], tmp_path)
    assert (tmp_path / MARKER).exists()  # the residual (see the docstring)
    _checker_refuses_unrendered(config, "config file", bad, tmp_path)


def test_the_answers_checker_reads_every_kind_of_file(
    replay: dict[str, Any], tmp_path: Path
) -> None:
    """Config and rc files, replay files, cruft's state, plain answers; unreadable ones in
    one line each."""
    edited = {**replay["cookiecutter"], "cluster": "nersc", "_commit": "0" * 40}
    files = {
        "rc.yaml": "default_context:\n  license: GPL-3.0\n  vscode: no\n",
        "replay.json": json.dumps(
            {**replay, "cookiecutter": {**replay["cookiecutter"], "license": "WTFPL"}}
        ),
        # .cruft.json with an edited choice, which `cruft update` would render
        "cruft.json": json.dumps({"template": "x", "context": {"cookiecutter": edited}}),
        "data.yml": "project_name: Heat Sim\nci: none\n",
        "cut.yaml": "default_context: [\n",
        "binary.yaml": "\udcff",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, "utf-8", errors="surrogateescape")
    checker = [sys.executable, str(ROOT / "tools" / "check_answers.py")]
    done = _run_engine([*checker, *files], tmp_path)
    assert done.returncode == 2  # a file that cannot be read outranks a refused value
    assert done.stdout == "data.yml (answers file): every value passes the template's rules\n"
    errors = done.stderr.splitlines()
    assert [line.rsplit(" (", 1)[-1] for line in errors[:4]] == [
        "config file rc.yaml)", "config file rc.yaml)", "replay file replay.json)",
        "cruft state cruft.json)",
    ]  # fmt: skip
    assert errors[0].startswith("ERROR: license 'GPL-3.0': must be one of MIT,")
    assert errors[1].startswith("ERROR: vscode 'False': is read by YAML as bool")
    assert errors[2].startswith("ERROR: license 'WTFPL': must be one of MIT,")
    assert errors[3].startswith("ERROR: cluster 'nersc': must be one of")
    assert errors[4].startswith("ERROR: cannot read cut.yaml: while parsing")
    assert errors[5].startswith("ERROR: cannot read binary.yaml: 'utf-8' codec")
    assert len(errors) == 6


@pytest.fixture(scope="module")
def replay(template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The replay file of a default cookiecutter bake."""
    folder = tmp_path_factory.mktemp("replay")
    config = _config(folder, {})
    args = [_tool("cookiecutter"), "--no-input", "-o", str(folder / "out")]
    done = _run_engine([*args, "--config-file", str(config), str(template)], folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((folder / "replay" / f"{template.name}.json").read_text("utf-8"))


@pytest.mark.parametrize(
    "bad",
    [
        {
            "license": "WTFPL",  # choices: prompts are skipped by a replay
            "example": "maybe",  # crashed the post-generation hook
            "cluster": "nonexistent",  # was reported as a derived __gpu_type
            "description": "\ud800",  # left a half-written project
            "author_name": "\u3164",
            "project_name": "{{ 6 * 7 }}",  # not rendered from a replay, still refused
            "_template_version": "9.9.9",
            "_project_owned": [],
            "_copy_without_render": ["*"],
        },
        {"_extensions": [], "_template_version": "9.9.9"},  # the pre-generation hook refuses
    ],
    ids=["answers-and-options", "no-early-rules"],
)
def test_replay_file_answers_are_checked(
    bad: dict[str, Any], replay: dict[str, Any], template: Path, tmp_path: Path
) -> None:
    tampered = {**replay, "cookiecutter": {**replay["cookiecutter"], **bad}}
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(tampered), "utf-8")
    out = tmp_path / "out"
    args = [_tool("cookiecutter"), "-o", str(out), "--replay-file", str(path), str(template)]
    result = _run_engine(args, tmp_path)
    assert result.returncode != 0
    first = next(iter(bad))
    fields = bad if first != "_extensions" else [first]
    for field in fields:
        assert f"ERROR: {field} " in result.stderr, (field, result.stderr[-3000:])
    assert "Traceback" not in result.stderr or first == "_extensions"
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("missing", [["project_slug"], ["author_name", "__gpu_type"]])
def test_a_replay_file_that_lacks_answers_names_them(
    missing: list[str], replay: dict[str, Any], template: Path, tmp_path: Path
) -> None:
    """cookiecutter would ask for them and crash rendering a default (project_slug's)."""
    kept = {k: v for k, v in replay["cookiecutter"].items() if k not in missing}
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({**replay, "cookiecutter": kept}), "utf-8")
    out = tmp_path / "out"
    args = [_tool("cookiecutter"), "-o", str(out), "--replay-file", path.name, str(template)]
    result = _run_engine(args, tmp_path, PWD=str(tmp_path))
    assert result.returncode != 0
    rule = "a replay file holds every answer; bake once without it to write a complete one"
    expected = [f"ERROR: {f}: missing from the replay file {path}; {rule}" for f in missing]
    assert result.stderr.splitlines() == expected
    assert not out.exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ('description: "x{{ 6 * 7 }}"', "description 'x{{ 6 * 7 }}': must not contain template"),
        ('author_name: "\\ud800"', "author_name '\\ud800': must not contain the invisible"),
        ('_template_version: "9.9.9"', "_template_version '9.9.9': is the template's own"),
        ("license: WTFPL", "license 'WTFPL': must be one of MIT, BSD-3-Clause"),
        ("license: [MIT]", "license \"['MIT']\": must be one of MIT, BSD-3-Clause"),
        ("project_name: {a: b}", "project_name \"{'a': 'b'}\": must be text"),
    ],
    ids=["template-syntax", "surrogate", "private", "choice", "list", "mapping"],
)
def test_copier_data_file_answers_end_with_the_rule(
    data: str, message: str, template: Path, tmp_path: Path
) -> None:
    (tmp_path / "data.yml").write_text(data + "\n", "utf-8")
    args = [_tool("copier"), "copy", "--defaults", "--trust", "--quiet", "--vcs-ref", "HEAD"]
    args += ["--data-file", str(tmp_path / "data.yml"), str(template), str(tmp_path / "out")]
    result = _run_engine(args, tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(f"ERROR: {message}")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_copier_update_checks_an_edited_answers_file(template: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    copy = [_tool("copier"), "copy", "--defaults", "--trust", "--quiet", str(template)]
    done = _run_engine([*copy, str(project)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = project / ".copier-answers.yml"
    text = answers.read_text("utf-8")
    edited = re.sub(r"(?m)^description: .*$", "description: x{{ 6 * 7 }}", text)
    answers.write_text(edited, "utf-8")
    git = ["git", "-c", "user.name=T", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "commit", "-qam", "edit"], cwd=project, check=True)
    before = (project / "pyproject.toml").read_text("utf-8")
    update = [_tool("copier"), "update", "--defaults", "--trust", "--quiet"]
    result = _run_engine(update, project)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR: description 'x{{ 6 * 7 }}': must not contain template")
    assert (project / "pyproject.toml").read_text("utf-8") == before
    status = subprocess.run(
        ["git", "status", "--short"], cwd=project, capture_output=True, check=True
    )
    assert status.stdout == b"", "the update wrote files"


@pytest.mark.parametrize("engine", ["cookiecutter", "cruft"])
def test_interactive_answers_are_checked_as_typed(
    engine: str, template: Path, tmp_path: Path
) -> None:
    """A bad typed answer is asked again at once; the answers typed before it are kept."""
    questions = [k for k in json.loads((ROOT / "cookiecutter.json").read_text()) if k[0] != "_"]
    typed = dict.fromkeys(questions, "")  # Enter: the default
    typed |= {"description": "Typed before the bad answer", "gpus_per_node": "9\n2"}
    out = tmp_path / "out"
    args = [_tool("cookiecutter"), "-o", str(out)] if engine == "cookiecutter" else [
        _tool("cruft"), "create", "--output-dir", str(out)]  # fmt: skip
    done = subprocess.run(
        [*args, str(template)],
        input="".join(f"{answer}\n" for answer in typed.values()),
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    message = "ERROR: gpus_per_node '9': exceeds the 8 GPUs per node of partition grete:shared"
    assert message in done.stderr
    project = out / "my_hpc_project"
    assert "--gpus-per-node=A100:2" in (project / "slurm" / "train.sbatch").read_text("utf-8")
    assert "Typed before the bad answer" in (project / "pyproject.toml").read_text("utf-8")


CRASH = """
import sys
import cookiecutter.generate as generate
from cookiecutter.main import cookiecutter

real, written = generate.generate_file, []


def crash_after_five(*args, **kwargs):
    written.append(args)
    if len(written) == 5:
        raise RuntimeError("crash inside the engine")
    return real(*args, **kwargs)


generate.generate_file = crash_after_five
cookiecutter(sys.argv[1], no_input=True, output_dir=sys.argv[2])
"""


def test_a_crash_inside_the_engine_leaves_nothing_written(template: Path, tmp_path: Path) -> None:
    """cookiecutter leaves a half-written project after an unexpected error; not with us."""
    out = tmp_path / "out"
    driver = tmp_path / "crash.py"
    driver.write_text(CRASH, "utf-8")
    done = _run_engine([sys.executable, str(driver), str(template), str(out)], tmp_path)
    assert "RuntimeError: crash inside the engine" in done.stderr
    assert done.returncode != 0
    assert "ERROR: the engine stopped half-way; removed" in done.stderr
    assert list(out.iterdir()) == []
