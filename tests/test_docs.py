"""The documentation: builds strictly, never goes stale, and agrees with the code.

- the site builds with `mkdocs build --strict` (broken links and anchors inside it fail),
  offline (no plugin that fetches, no web fonts);
- the options reference is exactly what tools/gen_options_doc.py writes now;
- relative links in the READMEs (template and generated) and the docs point at files;
- the annotated trees of docs/anatomy.md match real bakes;
- every `<slug> <command>` shown exists in the generated CLI, and every command line shown
  in a shell block parses there, with its `key=value` overrides accepted by the config;
  every `make <target>` shown exists in the Makefile it belongs to; every script path shown
  exists in a generated project;
- the generated README shows the first-screen commands of the chosen environment and
  cluster.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import gen_options_doc  # tools/ is on pytest's pythonpath
import pytest
import yaml
from engines import Bake, bake, make_value, shell_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SLUGS = {"my_hpc_project", "digits_workshop", "<slug>"}
# Answers of the extra bakes: every environment, both presets, the optional files.
VARIANTS = {
    # The longest slug there is (50 characters): the README's columns must hold.
    "conda-generic": {
        "environment": "conda",
        "cluster": "generic",
        "ci": "none",
        "example": "no",
        "project_name": "Thermal Convection Surrogates For Large Eddy Simulation Runs",
    },
    "apptainer-github": {"environment": "apptainer", "ci": "github", "snakemake": "yes"},
    "uv-mlflow": {"environment": "uv", "tracking": "mlflow", "vscode": "no"},
}


@pytest.fixture(scope="module")
def variants(template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bake]:
    """The extra bakes, made once for this module."""
    made = {}
    for name, answers in VARIANTS.items():
        made[name] = bake("cookiecutter", template, tmp_path_factory.mktemp(name), answers)
        assert made[name].ok, made[name].stderr
    return made


@pytest.fixture(scope="module")
def bakes(default_bake: Bake, variants: dict[str, Bake]) -> dict[str, Bake]:
    return {"default": default_bake, **variants}


# --------------------------------------------------------------------------- markdown parsing


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, also inside indented tabs."""
    pattern = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.S | re.M)
    return [(m.group(2), textwrap.dedent(m.group(3))) for m in pattern.finditer(text)]


def inline_code(text: str) -> list[str]:
    """Every inline code span outside fenced blocks."""
    outside = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", outside)


def shell_commands(body: str) -> list[list[str]]:
    """Simple commands of a shell block: continuation lines joined, split at ; && || |."""
    joined = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for line in joined.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] = []
        for word in [*tokens, ";"]:
            if word in {";", "&&", "||", "|", "&"} or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    current.append(word[:-1])
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def links(text: str) -> list[str]:
    """Targets of Markdown links and images, outside code."""
    no_code = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    no_code = re.sub(r"`[^`\n]*`", "", no_code)
    return re.findall(r"\]\(([^)\s]+)\)", no_code)


def documents(bakes: dict[str, Bake]) -> dict[str, tuple[Path, str]]:
    """Every Markdown file the checks cover: name -> (path, text)."""
    docs = {str(p.relative_to(ROOT)): p for p in [ROOT / "README.md", *PAGES]}
    for name, baked in bakes.items():
        for path in [baked.project / "README.md", *sorted((baked.project / "docs").glob("*.md"))]:
            docs[f"{name}:{path.relative_to(baked.project)}"] = path
    return {k: (p, p.read_text("utf-8")) for k, p in docs.items()}


# --------------------------------------------------------------------------- docs as tests

COMMANDS = {"bash", "sh", "console", "shell"}  # blocks of commands (``text`` shows output)
RUN_MARK = "<!-- run -->"
NOT_RUN = re.compile(r"<!-- not run: (.+) -->")
# A test a marker names: `tests/<file>.py` is one of the page's own suite (the project's in a
# generated project, the template's in the template); one of the other suite says whose it
# is, `template test tests/<file>.py` (the reader of a project has no template at hand) or
# `project test tests/<file>.py` (a generated project's test, named in the template's docs).
NAMED_TEST = re.compile(r"(?:(template|project) test )?(tests/\w+\.py)")
# What no named test runs, at the end of the marker: `not tested: ITEM, ITEM`, each item a
# command (`make container`) or a flag with its value (`--device cuda`); the reason is the
# marker's <why>.
NOT_TESTED = re.compile(r"\bnot tested: ([^;]+)$")
# The test that runs the pages' `<!-- run -->` blocks: a command of a marker naming it is
# covered by a run block that shows the same command.
TUTORIAL_TEST = "test_docs_tutorial.py"
# The programs of the template and the project whose lines a marker's test must run: the
# project's command, make, the template's engines and the scripts they ship. Anything else
# (pip, git, module, squeue, apptainer, pytest, ...) is the system's or the cluster's.
ENGINES = {"cookiecutter", "copier", "cruft"}
SCRIPT = re.compile(r"(?:\S*/)?(?:slurm|benchmarks|tools|container)/[\w.-]+|\S+\.(?:sh|sbatch|py)")
# Flags whose value is the reader's own (a run, a job or a folder of theirs, a time or memory
# request, the answers of a bake): a test gives its own, so only the flag must match.
OWN_VALUES = {"--run", "--name", "--dir", "--local-dir", "--output-dir", "--out", "--time"}
OWN_VALUES |= {"--mem", "--checkout", "--data", "--extra-context"}


def _placeholder(token: str) -> bool:
    return any(mark in token for mark in ("<", ">", "[", "]", "…", "...", "$"))


Flag = tuple[str, str | None]  # a flag or variable, with the value a test must give it


def _reader_owns(name: str, value: str) -> bool:
    """True for a value of the reader's own: a placeholder, a path, or one of OWN_VALUES."""
    return name in OWN_VALUES or _placeholder(value) or re.search(r"[/~]", value) is not None


def flags_of(args: list[str]) -> list[Flag]:
    """The flags of a command line, each with its value unless the value is the reader's own.

    A word after a flag is its value unless it is a flag or an override itself.
    """
    found: list[Flag] = []
    for i, word in enumerate(args):
        if not word.startswith("-") or _placeholder(word):
            continue
        name, has_value, value = word.partition("=")
        if not has_value and i + 1 < len(args) and not re.match(r"-|[\w.]+=", args[i + 1]):
            value = args[i + 1]
        found.append((name, value if value and not _reader_owns(name, value) else None))
    return found


def own_command(words: list[str]) -> tuple[tuple[str, ...], list[Flag]] | None:
    """(what names the command, the flags a test must pass) of a line of ours, else None.

    The name is the project's subcommand (`data freeze`), `make` and its target, an engine
    and its subcommand, or a script's file name; the flags include make's variables (and the
    flags inside `ARGS`) and what sbatch hands the script: `--array` and the variables of
    `--export` (its other options ask the cluster for resources).
    """
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    needed: list[Flag] = []
    if words[:1] == ["sbatch"]:
        words = words[1:]
        while words and words[0].startswith("-"):
            option, _, value = words.pop(0).partition("=")
            needed += [(option, None)] if option == "--array" else []
            for item in value.split(",")[1:] if option == "--export" else []:
                variable, _, given = item.partition("=")
                needed.append((variable, None if _reader_owns(variable, given) else given))
    if words and (words[0] in {"python", "python3", "bash"} or words[0].endswith("/python")):
        words = words[2:] if words[1:2] == ["-m"] else words[1:]
    if not words:
        return None
    program, rest = words[0], words[1:]
    if program in SLUGS:
        name = rest[:2] if rest[:1] == ["data"] else rest[:1]
        return tuple(name), needed + flags_of(rest)
    if program == "make":
        target = [w for w in rest if re.fullmatch(r"[a-z][\w-]*", w)][:1]
        for word in rest:
            variable, is_value, value = word.partition("=")
            if is_value and re.fullmatch(r"[A-Z_]+", variable):
                needed.append((variable, None))
                needed += flags_of(shlex.split(value)) if variable == "ARGS" else []
        return ("make", *target), needed
    if program in ENGINES:
        sub = rest[:1] if program != "cookiecutter" and not rest[0].startswith("-") else []
        return (program, *sub), needed + flags_of(rest)
    if SCRIPT.fullmatch(program):
        return (Path(program).name,), needed + flags_of(rest)
    return None


def _words(text: str) -> set[str]:
    """A string of a test as the words it may pass: itself, its shell words and their parts.

    `--flag=value`, `VAR=value` and `ALL,VAR=value` give their parts, a path its file name.
    """
    try:
        split = shlex.split(text)
    except ValueError:
        split = text.split()
    found = {text}
    for word in split:
        found |= {word, *re.split(r"[=,]", word), word.rsplit("/", 1)[-1]}
    return found - {""}


def _code(node: ast.AST) -> tuple[set[str], set[str]]:
    """(the words a piece of code passes on, the names it refers to).

    Words are its strings and keyword names (`LAUNCHER="torchrun"` hands a variable on).
    """
    words: set[str] = set()
    names: set[str] = set()
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            words |= _words(part.value)
        elif isinstance(part, ast.keyword) and part.arg:
            words.add(part.arg)
        elif isinstance(part, ast.Name):
            names.add(part.id)
        elif isinstance(part, ast.Attribute):
            names.add(part.attr)
    return words, names


@functools.cache
def passed_words(path: Path) -> tuple[frozenset[str], ...]:
    """The words each function of a test file passes on, with those of what it uses.

    A function uses the functions and module constants it names: its file's, conftest.py's
    and those of the modules beside it that the file imports (the argv a helper builds is
    the test's). Its decorators count too (a parametrize that names the scripts).
    """
    tree = ast.parse(path.read_text("utf-8"))
    modules = [path, path.parent / "conftest.py"]
    for node in ast.walk(tree):
        imported = [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
        imported += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        modules += [path.parent / f"{name.replace('.', '/')}.py" for name in imported if name]
    functions: dict[str, list[tuple[set[str], set[str]]]] = {}
    constants: dict[str, tuple[set[str], set[str]]] = {}
    own: list[str] = []
    for module in dict.fromkeys(m for m in modules if m.is_file()):
        module_tree = tree if module == path else ast.parse(module.read_text("utf-8"))
        for node in ast.walk(module_tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append(_code(node))
                own += [node.name] if module == path else []
        for node in module_tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets += [node.target] if isinstance(node, ast.AnnAssign) else []
            constants.update({t.id: _code(node) for t in targets if isinstance(t, ast.Name)})
    calls = []
    for function in dict.fromkeys(own):
        words: set[str] = set()
        seen, todo = set(), [function]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for found, names in [*functions.get(name, []), constants.get(name, (set(), set()))]:
                words |= found
                todo += names
        calls.append(frozenset(words))
    return tuple(calls)


def runs_it(words: frozenset[str], name: tuple[str, ...], flags: list[Flag]) -> bool:
    """True when one test function's words hold the command's name and every flag.

    A pattern among the words (`bench_*.py`, a glob over scripts) names what it matches.
    """
    patterns = [w for w in words if "*" in w and not w.startswith("*")]

    def named(part: str) -> bool:
        return part in words or any(fnmatch.fnmatchcase(part, p) for p in patterns)

    given = all(flag in words and (value is None or value in words) for flag, value in flags)
    return all(map(named, name)) and given


def marked_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, marker, commands) of every command block: the marker is the line before it.

    In a `console` block the commands are the lines after `$ `; the rest is their output.
    """
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        opening = line.strip()
        if not opening.startswith("```") or opening[3:].strip() not in COMMANDS:
            continue
        marker = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        indent = len(line) - len(line.lstrip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = [ln[indent:] for ln in lines[i + 1 : end]]
        if opening[3:].strip() == "console":
            body = [ln[2:] for ln in body if ln.startswith("$ ")]
        found.append((i + 1, marker, "\n".join(body)))
    return found


def named_tests(reason: str, own: Path, project: Path) -> tuple[list[Path], list[str]]:
    """The test files a marker's reason names, and what is wrong with the names.

    A plain `tests/<file>.py` is below `own` (the template, or the page's project); after
    `template test ` it is the template's, after `project test ` the project's (the page's,
    or the default bake's for the template's pages).
    """
    suites = {"template": ROOT, "project": project}
    paths, problems = [], []
    for whose, name in NAMED_TEST.findall(reason):
        path = suites.get(whose, own) / name
        elsewhere = [w for w, root in suites.items() if root != own and (root / name).is_file()]
        if path.is_file():
            paths.append(path)
        elif not whose and elsewhere:
            problems.append(f"{name} is the {elsewhere[0]}'s: `{elsewhere[0]} test {name}`")
        else:
            problems.append(f"{name} does not exist")
    return paths, problems


def runs_in(
    tests: list[Path], ran: list[list[str]], name: tuple[str, ...], flags: list[Flag]
) -> bool:
    """True when a function of one of `tests` runs the command with these flags.

    Also when tests/test_docs_tutorial.py is among them and a run block (`ran`) shows it.
    """
    if any(runs_it(words, name, flags) for test in tests for words in passed_words(test)):
        return True
    shown = [own_command(r) for r in ran] if any(t.name == TUTORIAL_TEST for t in tests) else []
    return any(s and s[0] == name and set(flags) <= set(s[1]) for s in shown)


def unaccounted_blocks(text: str, own: Path, project: Path, ran: list[list[str]]) -> list[str]:
    """Command blocks that neither run in the tests nor name tests that run their commands.

    A block runs when `<!-- run -->` comes before it (tests/test_docs_tutorial.py runs those
    pages, `ran` their commands). Otherwise `<!-- not run: <why>; <the tests> -->` must, its
    tests named as `named_tests` reads them; each command of ours in the block (`own_command`)
    is run with the same name and flags by one of them (`runs_in`), or the marker ends with
    `not tested: <command or flag>, ...`, and each of those is in the block.
    """
    problems = []
    for line, marker, body in marked_blocks(text):
        if marker == RUN_MARK:
            continue
        if not (reason := NOT_RUN.fullmatch(marker)):
            problems.append(f"line {line}: neither <!-- run --> nor <!-- not run: ... -->")
            continue
        tests, wrong = named_tests(reason.group(1), own, project)
        if not NAMED_TEST.search(reason.group(1)):
            wrong.append("the reason names no test (tests/<file>.py)")
        untested = NOT_TESTED.search(reason.group(1))
        items = [item.split() for item in untested.group(1).split(",")] if untested else []
        excused: list[list[str]] = []
        for words in shell_commands(body):
            if not (command := own_command(words)):
                continue
            name, flags = command
            if whole := [i for i in items if (own_command(i) or ((),))[0] == name]:
                excused += whole
                continue
            excused += [i for i in items if any(i[0] == flag for flag, _ in flags)]
            left = [f for f in flags if not any(i[0] == f[0] for i in items)]
            if not runs_in(tests, ran, name, left):
                wanted = " ".join([*name, *(f"{f} {v}" if v else f for f, v in left)])
                wrong.append(f"no test it names runs `{wanted}` ({' '.join(words)})")
        wrong += [
            f"`not tested: {' '.join(i)}` is no command or flag of the block"
            for i in items
            if i not in excused
        ]
        problems += [f"line {line}: {problem}" for problem in wrong]
    return problems


def run_block_commands(pages: dict[str, tuple[Path, str]]) -> list[list[str]]:
    """The commands of every `<!-- run -->` block of these pages."""
    return [
        words
        for _, text in pages.values()
        for _, marker, body in marked_blocks(text)
        if marker == RUN_MARK
        for words in shell_commands(body)
    ]


def checked_pages(bakes: dict[str, Bake]) -> dict[str, tuple[Path, str]]:
    """The pages whose markers are checked: the docs, and the READMEs of data/ and slurm/."""
    pages = documents(bakes)
    for name, baked in bakes.items():
        for readme in ("data/README.md", "slurm/README.md"):
            path = baked.project / readme
            pages[f"{name}:{readme}"] = (path, path.read_text("utf-8"))
    return pages


def test_every_command_block_runs_or_says_why(bakes: dict[str, Bake]) -> None:
    """Docs as tests: each command block of every page (template and projects) is accounted for."""
    pages = checked_pages(bakes)
    ran = run_block_commands(pages)
    problems = []
    for name, (path, text) in pages.items():
        baked = next((b.project for b in bakes.values() if path.is_relative_to(b.project)), None)
        project = baked or bakes["default"].project
        problems += [f"{name} {p}" for p in unaccounted_blocks(text, baked or ROOT, project, ran)]
    assert not problems, "\n".join(problems)


def test_a_block_without_its_reason_or_test_is_found() -> None:
    fence = ["```bash", "make x", "```"]
    assert unaccounted_blocks("\n".join(fence), ROOT, ROOT, []) == [
        "line 1: neither <!-- run --> nor <!-- not run: ... -->"
    ]
    vague = "\n".join(["<!-- not run: needs a cluster -->", *fence])
    no_test = "line 2: the reason names no test (tests/<file>.py)"
    assert no_test in unaccounted_blocks(vague, ROOT, ROOT, [])
    gone = "\n".join(["<!-- not run: cluster; tests/test_gone.py -->", "```bash", "ls", "```"])
    assert unaccounted_blocks(gone, ROOT, ROOT, []) == ["line 2: tests/test_gone.py does not exist"]
    fine = "\n".join(["<!-- not run: cluster; tests/test_docs.py -->", "```bash", "ls", "```"])
    assert unaccounted_blocks("\n".join([fine, RUN_MARK, *fence]), ROOT, ROOT, []) == []


FAKE_TEST = """
import pytest
from pathlib import Path

def cli(*args): ...
def run_make(target, **values): return ["make", target, *values]

def test_export():
    cli("export", "--run", "mine", "--weights", "best")

def test_compare():
    run_make("compare", ARGS="'lr-*' --metric accuracy")

@pytest.mark.parametrize("script", Path("benchmarks").glob("bench_*.py"))
def test_benchmarks(script):
    cli(str(script), "--help")
"""


def test_a_marker_names_tests_that_run_its_commands(tmp_path: Path) -> None:
    """Each command of ours in a `not run` block: its name and flags in a named test's source."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text(FAKE_TEST, "utf-8")

    def check(reason: str, *lines: str, ran: list[list[str]] | None = None) -> list[str]:
        page = [f"<!-- not run: {reason} -->", "```bash", *lines, "```"]
        return unaccounted_blocks("\n".join(page), tmp_path, tmp_path, ran or [])

    named = "a GPU run; tests/test_fake.py"
    assert check(named, "my_hpc_project export --run lm-fsdp --weights best") == []
    dtype = "my_hpc_project export --run lm-fsdp --weights best --dtype bf16"
    assert check(named, dtype) == [
        f"line 2: no test it names runs `export --run --weights best --dtype bf16` ({dtype})"
    ]
    assert check(named, "my_hpc_project export --weights final")[0].startswith("line 2: no test")
    assert check(f"{named}; not tested: --dtype bf16", dtype) == []
    assert check(f"{named}; not tested: --lightning", dtype) == [
        f"line 2: no test it names runs `export --run --weights best --dtype bf16` ({dtype})",
        "line 2: `not tested: --lightning` is no command or flag of the block",
    ]
    # make's variables, the flags inside ARGS as typed, and a command named not tested
    assert check(named, """make compare ARGS="'4711_*' --metric accuracy" """) == []
    assert check(named, 'make compare ARGS="--metric loss"')[0].startswith("line 2: no test")
    assert check(named, "make compare JSON=1")[0].startswith("line 2: no test")
    assert check(f"{named}; not tested: make container", "make container") == []
    # a glob over scripts in a test names each script it matches
    assert check(named, "python benchmarks/bench_lm.py") == []
    assert check(named, "python benchmarks/bench_lm.py --device cuda")[0].startswith("line 2: no")
    # a test of the template named from a project's page says so, and then counts
    assert check("x; tests/test_docs.py", "ls") == [
        "line 2: tests/test_docs.py is the template's: `template test tests/test_docs.py`"
    ]
    assert check("x; template test tests/test_docs.py", "ls") == []
    # the tutorial's test runs the run blocks: one showing the command covers it
    tutorial = "x; template test tests/test_docs_tutorial.py"
    shown = ["my_hpc_project", "frobnicate", "--quick"]
    assert check(tutorial, " ".join(shown), ran=[shown]) == []
    assert check(tutorial, " ".join(shown))[0].startswith("line 2: no test")


# --------------------------------------------------------------------------- the site


def test_mkdocs_config_stays_offline() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text("utf-8"))
    assert config["theme"]["name"] == "material"
    assert config["theme"]["font"] is False, "Google Fonts would be fetched"
    assert config["plugins"] == ["search"], "social/privacy plugins fetch from the web"
    assert config.get("strict") is True


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's end-of-life banner
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    built = {
        p.relative_to(tmp_path / "site").with_suffix(".md")
        for p in (tmp_path / "site").rglob("*.html")
    }
    for page in PAGES:
        assert page.relative_to(DOCS) in built, f"{page} was not built"
    # Nothing the pages load (scripts, styles, fonts, images) comes from the web.
    for html in (tmp_path / "site").rglob("*.html"):
        text = html.read_text("utf-8")
        remote = re.findall(r'src="https?://[^"]+"|<link[^>]+href="https?://[^"]+"', text)
        assert not remote, f"{html.name} loads {remote}"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    for page in PAGES:
        assert str(page.relative_to(DOCS)) in nav, f"{page.relative_to(ROOT)} is missing from nav"


def test_options_reference_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "tools/gen_options_doc.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_options_reference_has_a_rejected_sample_for_every_rule() -> None:
    tool = gen_options_doc
    rules = tool.load_rules()
    cc = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
    sampled = {field for field, _, _ in tool.SAMPLES}
    own_rules = set(rules.RULES) | set(getattr(rules, "CONTEXT_RULES", {}))
    assert own_rules <= sampled, f"no sample bad answer for {sorted(own_rules - sampled)}"
    for field, value, message in tool.sample_messages(rules, cc):
        assert message.startswith(f"{field} "), f"{field}={value!r} is accepted now: {message!r}"


def test_options_reference_lists_every_question_and_preset() -> None:
    page = (DOCS / "reference" / "options.md").read_text("utf-8")
    cc = json.loads((ROOT / "cookiecutter.json").read_text("utf-8"))
    for name in cc:
        if not name.startswith("_"):
            assert f"| `{name}` |" in page
    for preset in cc["_presets"]:
        assert f"### `{preset}`" in page


# --------------------------------------------------------------------------- links


def test_relative_links_point_at_files(bakes: dict[str, Bake]) -> None:
    broken = []
    for name, (path, text) in documents(bakes).items():
        for target in links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            if not (path.parent / file_part).exists():
                broken.append(f"{name}: {target}")
    assert not broken, broken


def test_links_into_the_docs_name_existing_headings() -> None:
    """Anchors of links between pages, checked here too so the message names the link."""

    def anchors(page: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", page.read_text("utf-8"), flags=re.M)
        slugs = set()
        for head in heads:
            slug = re.sub(r"[^\w\- ]", "", head.lower()).strip()
            slugs.add(re.sub(r"[\s]+", "-", slug))
        return slugs

    broken = []
    for page in PAGES:
        for target in links(page.read_text("utf-8")):
            if "#" not in target or re.match(r"^[a-z]+:", target):
                continue
            file_part, anchor = target.split("#", 1)
            dest = (page.parent / file_part) if file_part else page
            if dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


# --------------------------------------------------------------------------- anatomy trees


def parse_tree(body: str) -> tuple[set[str], set[str]]:
    """(paths listed, folders whose listing is partial) of an annotated tree block."""
    paths: set[str] = set()
    partial: set[str] = set()
    stack: list[str] = []
    for line in body.splitlines()[1:]:  # the first line is the project folder
        match = re.match(r"^([│├└─\s]*)(\S+)", line)
        if not match:
            continue
        depth = len(match.group(1)) // 4
        name = match.group(2)
        del stack[depth - 1 :]
        if name == "…":
            partial.add("/".join(stack))
            continue
        stack.append(name.rstrip("/"))
        paths.add("/".join(stack))
    return paths, partial


def baked_paths(project: Path) -> set[str]:
    """Files of a bake and the folders holding them, without git and engine bookkeeping.

    (Folders are counted through the files they hold.)
    """
    skip = {".git", ".copier-answers.yml", ".cruft.json"}
    files = [
        p.relative_to(project)
        for p in project.rglob("*")
        if p.is_file() and p.relative_to(project).parts[0] not in skip
    ]
    return {f.as_posix() for f in files} | {d.as_posix() for f in files for d in f.parents[:-1]}


def tree_blocks() -> list[tuple[dict[str, str], str]]:
    """(answers, tree) for every `<!-- tree[: answers] -->` block of docs/anatomy.md."""
    text = (DOCS / "anatomy.md").read_text("utf-8")
    found = []
    for match in re.finditer(r"<!-- tree(?::([^>]*))? -->\s*```text\n(.*?)```", text, re.S):
        answers = dict(item.split("=", 1) for item in (match.group(1) or "").split())
        found.append((answers, match.group(2)))
    return found


def test_anatomy_default_tree_matches_a_bake(default_bake: Bake) -> None:
    (answers, body), *_ = tree_blocks()
    assert answers == {}
    listed, partial = parse_tree(body)
    real = baked_paths(default_bake.project)
    assert not listed - real, f"the page lists files a default bake lacks: {sorted(listed - real)}"
    unlisted = {
        p for p in real - listed if not any(p == d or p.startswith(f"{d}/") for d in partial)
    }
    assert not unlisted, f"files of a default bake the page does not explain: {sorted(unlisted)}"


def test_anatomy_optional_tree_matches_a_bake(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    _, (answers, body), *_ = tree_blocks()
    baked = bake("cookiecutter", template, tmp_path, answers)
    assert baked.ok, baked.stderr
    listed, _ = parse_tree(body)
    real = baked_paths(baked.project)
    assert not listed - real, sorted(listed - real)
    extra = real - baked_paths(default_bake.project)
    assert not extra - listed, f"optional files the page does not explain: {sorted(extra - listed)}"


# --------------------------------------------------------------------------- commands

PROBE = r"""
import json, sys
from pathlib import Path
from {slug}.cli import build_parser
from {slug}.task import load_config
parser = build_parser()
sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
results = {{"commands": sorted(sub.choices), "errors": []}}
for argv in json.loads(sys.argv[1]):
    try:
        args = parser.parse_args(argv)
        overrides = getattr(args, "overrides", None)
        if overrides:
            load_config(Path("configs/train.toml"), overrides)
    except SystemExit as exc:
        if exc.code:
            results["errors"].append(" ".join(argv))
    except Exception as exc:
        results["errors"].append(" ".join(argv) + ": " + str(exc))
print(json.dumps(results))
"""


def probe_cli(project: Path, argvs: list[list[str]]) -> dict[str, Any]:
    """Parse command lines with the baked project's own parser and config loader."""
    slug = project.name
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(slug=slug), json.dumps(argvs)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def shown_cli_calls(text: str) -> tuple[set[str], list[list[str]]]:
    """(subcommands named anywhere, complete argv lists from shell blocks) of one document."""
    names: set[str] = set()
    full: list[list[str]] = []
    for span in inline_code(text):
        words = span.split()
        if len(words) > 1 and words[0] in SLUGS and not _placeholder(words[1]):
            names.add(words[1])
    for lang, body in fenced_blocks(text):
        if lang not in {"bash", "sh", "console", "shell"}:
            continue
        for words in shell_commands(body):
            # `python -m <slug> ...` is the same CLI as `<slug> ...`
            python_m = words[:2] in (["python", "-m"], ["python3", "-m"])
            command = words[2:] if python_m else words
            if command and command[0] in SLUGS and len(command) > 1:
                names.add(command[1])
                if not any(_placeholder(t) for t in command[1:]):
                    full.append(command[1:])
            overrides = [t for t in command if re.fullmatch(r"[a-z_]+\.[a-z_]+=\S+", t)]
            shown_safe = overrides and not any(_placeholder(t) for t in overrides)
            if shown_safe and "slurm/" in " ".join(command):
                full.append(["train", *overrides])
    return names, full


def created_paths(text: str) -> set[str]:
    """Files a page makes itself: `<!-- write PATH -->` blocks and `cp SOURCE PATH` lines."""
    written = re.findall(r"<!-- write (\S+) -->", text)
    copied = re.findall(r"^cp \S+ (\S+)$", text, flags=re.MULTILINE)
    return {p.replace("digits_workshop", "my_hpc_project") for p in written + copied}


def test_cli_commands_shown_exist_and_parse(bakes: dict[str, Bake], tmp_path: Path) -> None:
    names: set[str] = set()
    full: list[list[str]] = []
    created: set[str] = set()
    for _, text in documents(bakes).values():
        more_names, more_full = shown_cli_calls(text)
        names |= more_names
        full += more_full
        created |= created_paths(text)
    assert len(full) >= 10, "the docs should show runnable commands"
    # Tasks the pages write themselves exist when their commands run (the docs tests run
    # those pages for real); here a copy of a shipped task stands in for each.
    project = tmp_path / bakes["default"].project.name
    shutil.copytree(bakes["default"].project, project, symlinks=True)
    tasks = project / "src" / project.name / "tasks"
    for path in created:
        if re.fullmatch(rf"src/{project.name}/tasks/\w+\.py", path):
            shutil.copy(tasks / "regression.py", project / path)
    result = probe_cli(project, full)
    assert not names - set(result["commands"]), (
        f"unknown commands: {names - set(result['commands'])}"
    )
    assert not result["errors"], f"command lines the CLI rejects: {result['errors']}"


def make_targets(makefile: Path) -> set[str]:
    """Targets defined in a (rendered) Makefile."""
    text = makefile.read_text("utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, flags=re.M))


def shown_make_targets(text: str) -> set[str]:
    """Targets of every `make <target>` in code of one document."""
    found = set()
    spans = inline_code(text) + [b for lang, b in fenced_blocks(text) if lang in {"bash", "sh", ""}]
    for span in spans:
        for match in re.finditer(r"(?:^|[\s;&(])make\s+([a-z][\w-]*)", span):
            found.add(match.group(1))
    return found


def test_make_targets_shown_exist(bakes: dict[str, Bake]) -> None:
    template_targets = make_targets(ROOT / "Makefile")
    generated = {name: make_targets(b.project / "Makefile") for name, b in bakes.items()}
    any_generated = set().union(*generated.values())
    missing = []
    for name, (_, text) in documents(bakes).items():
        shown = shown_make_targets(text)
        if name in {"README.md", "docs/contributing.md"}:
            allowed = template_targets
        elif ":" in name:  # a generated file: its own project's Makefile
            allowed = generated[name.split(":")[0]]
        else:
            allowed = any_generated | template_targets
        missing += [f"{name}: make {t}" for t in sorted(shown - allowed)]
    assert not missing, missing


def test_script_paths_shown_exist(bakes: dict[str, Bake]) -> None:
    real = set().union(*(baked_paths(b.project) for b in bakes.values()))
    missing = []
    for name, (_, text) in documents(bakes).items():
        scripts = (
            r"(?<![\w/.-])((?:slurm|container|configs|workflow)/(?:[\w.-]+/)*"
            r"(?:[\w.-]+\.(?:sh|sbatch|def|toml|ya?ml)|Snakefile))"
        )
        for path in set(re.findall(scripts, text)) - created_paths(text):
            generic = path.replace("digits_workshop", "my_hpc_project")
            artifact = path.endswith(".sif")  # built by `make container`, not generated
            if generic not in real and not artifact:
                missing.append(f"{name}: {path}")
    assert not missing, missing


# --------------------------------------------------------------------------- generated README


CLUSTER_STEPS = "## First steps on the cluster"


def readme_first_screen(project: Path) -> str:
    """The cluster's command block (the README's second, after the laptop's)."""
    text = (project / "README.md").read_text("utf-8")
    return fenced_blocks(text.split(CLUSTER_STEPS, 1)[1])[0][1]


def test_generated_readme_opens_with_the_laptop_route(bakes: dict[str, Bake]) -> None:
    """What the project is, the laptop's two commands, then the cluster (docs/tutorial.md)."""
    for name, baked in bakes.items():
        text = (baked.project / "README.md").read_text("utf-8")
        laptop, cluster = text.split(CLUSTER_STEPS, 1)
        assert len(laptop) < 1200, f"{name}: the cluster steps are off the first screen"
        commands = fenced_blocks(laptop)[0][1].splitlines()
        assert len(commands) == 2, f"{name}: {commands}"
        assert commands[0].startswith("make install-cpu && "), name
        slug = baked.project.name
        example = (baked.project / "src" / slug / "tasks" / "digits.py").is_file()
        second = f"{slug} prepare && {slug} train" if example else "make test"
        assert commands[1].startswith(second), f"{name}: {commands[1]!r}"
        assert len({line.index("  # ") for line in commands}) == 1, f"{name}: comment columns"
        assert "[`docs/tutorial.md`](docs/tutorial.md)" in laptop
        assert (baked.project / "docs" / "tutorial.md").is_file()
        assert "make install" in fenced_blocks(cluster)[0][1]


def test_generated_readme_first_screen_venv_grete(default_bake: Bake) -> None:
    screen = readme_first_screen(default_bake.project)
    lines = [line.split("#")[0].strip() for line in screen.splitlines()]
    # No CUDA module: the torch wheels bring their own CUDA (a module's could shadow them).
    assert lines[:2] == ["module load miniforge3", "make install"]
    assert "make install" in lines
    assert "source .venv/bin/activate" in lines
    assert "sbatch slurm/train.sbatch" in lines
    text = (default_bake.project / "README.md").read_text("utf-8")
    assert "ssh glogin-gpu.hpc.gwdg.de" in text
    assert "{{" not in text
    assert "{%" not in text


def test_generated_readme_first_screen_conda_generic(variants: dict[str, Bake]) -> None:
    project = variants["conda-generic"].project
    screen = readme_first_screen(project)
    assert "module load" not in screen, "the generic preset has no modules"
    assert "conda activate ./.conda" in screen
    assert ".venv" not in screen
    # Without the example, the first screen records the user's data and points at the reader.
    assert "data freeze --update" in screen
    assert "tasks/my_task.py" in screen
    assert "ssh login.example.org" in (project / "README.md").read_text("utf-8")


def test_generated_readme_first_screen_apptainer(variants: dict[str, Bake]) -> None:
    screen = readme_first_screen(variants["apptainer-github"].project)
    assert "module load apptainer" in screen
    assert "make container" in screen
    assert screen.index("make container") < screen.index("sbatch slurm/train.sbatch")


def test_generated_readme_first_screen_keeps_its_comment_column(bakes: dict[str, Bake]) -> None:
    for name, baked in bakes.items():
        commented = [
            line for line in readme_first_screen(baked.project).splitlines() if " # " in line
        ]
        assert len(commented) >= 4, name
        columns = {line.index(" # ") for line in commented}
        assert len(columns) == 1, f"{name}: comments start in columns {sorted(columns)}"


def test_generated_readme_map_of_files_names_real_files(bakes: dict[str, Bake]) -> None:
    """The "Files you can ignore today" tables name files and folders of this very bake."""
    for name, baked in bakes.items():
        text = (baked.project / "README.md").read_text("utf-8")
        section = text.split("## Files you can ignore today", 1)[1].split("\n## ", 1)[0]
        named = {
            code.split("<", 1)[0].rstrip("/")
            for row in section.splitlines()
            if row.startswith("| `")
            for code in re.findall(r"`([^`]+)`", row.split(" | ")[0])
        }
        assert len(named) > 12, name
        missing = sorted(p for p in named if not (baked.project / p).exists())
        assert missing == [], f"{name}: the map names what the bake lacks: {missing}"


def test_demo_installs_only_what_the_demo_needs(default_bake: Bake) -> None:
    """requirements-demo.txt: cookiecutter and the project's own dependencies, nothing else."""
    pyproject = tomllib.loads((default_bake.project / "pyproject.toml").read_text("utf-8"))
    needed = {
        canonicalize_name(req.name)
        for req in map(Requirement, pyproject["project"]["dependencies"])
        if req.name != "torch" and (req.marker is None or req.marker.evaluate())
    }
    lines = (ROOT / "requirements-demo.txt").read_text("utf-8").splitlines()
    demo = {canonicalize_name(Requirement(line).name) for line in lines if line and line[0] != "#"}
    assert demo == needed | {"cookiecutter"}
    # The demo's recipe runs in its own environment, never in the tests' .venv.
    makefile = (ROOT / "Makefile").read_text("utf-8")
    recipe = makefile.split("\ndemo: ", 1)[1].split("\n\n", 1)[0]
    assert recipe.startswith("$(DEMO_STAMP)")
    assert "$(BIN)" not in recipe
    assert "-r requirements-demo.txt" in makefile.split("$(DEMO_STAMP):", 1)[1].split("\n\n")[0]
    # The install as make runs it: torch alone from the CPU index, then the rest with torch
    # named again, or torch's own dependencies (typing-extensions, sympy, ...) never come in.
    dry = subprocess.run(
        ["make", "-n", "-B", "build/demo-env/.installed"],
        cwd=ROOT,
        env=shell_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    torch, rest = (shlex.split(ln) for ln in dry.splitlines() if "/pip install" in ln)
    # The pin reaches both installs as the exported variable $TORCH (never pasted into the
    # recipe); its default is one exact version.
    pin = make_value(ROOT, "TORCH")
    assert pin.startswith("torch==") and " " not in pin, pin
    assert {"--no-deps", "$TORCH", "https://download.pytorch.org/whl/cpu"} <= set(torch), torch
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert "-r" in rest and "$TORCH" in rest and "--index-url" not in rest, rest


def test_generated_readme_states_the_job_of_the_answers(template: Path, tmp_path: Path) -> None:
    answers = {"cluster": "generic", "nodes": "2", "gpus_per_node": "4", "time_limit": "1-00:00:00"}
    baked = bake("cookiecutter", template, tmp_path, answers)
    assert baked.ok, baked.stderr
    text = " ".join((baked.project / "README.md").read_text("utf-8").split())
    assert (
        "The job asks partition `gpu` for 2 nodes with 4 GPUs each for up to `1-00:00:00`" in text
    )
    assert "a shell on a GPU of `gpu`" in text


def test_the_project_docs_examples_do_not_collide(default_bake: Bake) -> None:
    """A reader who runs the pages in one project gets each page's `compare` table as shown.

    A page's `compare GLOB` must match no run that another page names (training.md's
    `lr-1e-3` once put a fourth run and three columns into compare-runs.md's `lr-*` table).
    """
    pages = sorted((default_bake.project / "docs").glob("*.md"))
    names = {p.name: set(re.findall(r"run\.name=([\w.-]+)", p.read_text("utf-8"))) for p in pages}
    globs = {p.name: re.findall(r"compare '([^']+)'", p.read_text("utf-8")) for p in pages}
    assert any(globs.values()), "no page compares runs by a glob any more"
    for page, patterns in globs.items():
        others = {name for other, found in names.items() if other != page for name in found}
        for pattern in patterns:
            clashes = sorted(name for name in others if fnmatch.fnmatch(name, pattern))
            assert not clashes, f"{page}: compare '{pattern}' also matches {clashes}"
