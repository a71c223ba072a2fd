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

import fnmatch
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


def unaccounted_blocks(text: str, roots: list[Path]) -> list[str]:
    """Command blocks that neither run in the tests nor say why not and which test covers them.

    A block runs when `<!-- run -->` comes before it (tests/test_docs_tutorial.py runs those
    pages). Otherwise `<!-- not run: <why>; <the test covering it> -->` must: the test named
    as `tests/<file>.py`, found below one of `roots` (the template, or the project).
    """
    lines = text.splitlines()
    problems = []
    for i, line in enumerate(lines):
        opening = line.strip()
        if not opening.startswith("```") or opening[3:].strip() not in COMMANDS:
            continue
        marker = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        if marker == RUN_MARK:
            continue
        if not (reason := NOT_RUN.fullmatch(marker)):
            problems.append(f"line {i + 1}: neither <!-- run --> nor <!-- not run: ... -->")
            continue
        named = re.findall(r"tests/\w+\.py", reason.group(1))
        if not named:
            problems.append(f"line {i + 1}: the reason names no test (tests/<file>.py)")
        problems += [
            f"line {i + 1}: {name} does not exist"
            for name in named
            if not any((root / name).is_file() for root in roots)
        ]
    return problems


def test_every_command_block_runs_or_says_why(bakes: dict[str, Bake]) -> None:
    """Docs as tests: each command block of every page (template and projects) is accounted for."""
    pages = documents(bakes)
    for name, baked in bakes.items():
        data = baked.project / "data" / "README.md"
        pages[f"{name}:data/README.md"] = (data, data.read_text("utf-8"))
    problems = []
    for name, (path, text) in pages.items():
        project = next((b.project for b in bakes.values() if path.is_relative_to(b.project)), ROOT)
        problems += [f"{name} {p}" for p in unaccounted_blocks(text, [ROOT, project])]
    assert not problems, "\n".join(problems)


def test_a_block_without_its_reason_or_test_is_found() -> None:
    fence = ["```bash", "make x", "```"]
    assert unaccounted_blocks("\n".join(fence), [ROOT]) == [
        "line 1: neither <!-- run --> nor <!-- not run: ... -->"
    ]
    vague = "\n".join(["<!-- not run: needs a cluster -->", *fence])
    no_test = "line 2: the reason names no test (tests/<file>.py)"
    assert unaccounted_blocks(vague, [ROOT]) == [no_test]
    gone = "\n".join(["<!-- not run: cluster; tests/test_gone.py -->", *fence])
    assert unaccounted_blocks(gone, [ROOT]) == ["line 2: tests/test_gone.py does not exist"]
    fine = "\n".join(["<!-- not run: cluster; tests/test_docs.py -->", *fence, RUN_MARK, *fence])
    assert unaccounted_blocks(fine, [ROOT]) == []


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


def _placeholder(token: str) -> bool:
    return any(mark in token for mark in ("<", ">", "[", "]", "…", "...", "$"))


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
