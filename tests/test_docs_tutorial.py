"""Docs as tests: run the tutorial's tested steps in order on a freshly generated project.

In docs/tutorial.md a code block after `<!-- run -->` is executed (bash, in the folder the
previous block ended in), a code block after `<!-- write PATH -->` is written to PATH (a file
the page shows in full, e.g. a task module), and a `text` block after `<!-- expect -->` holds
output that must appear: each of its non-empty lines, in order, inside the output lines
(stdout and stderr together). Numbers match any number and `…` matches anything, so
timings, paths and losses may differ while the words, the order and the shape must not.
After `<!-- expect exact -->` the block is the whole output instead: one line for each
non-empty output line, each matching all of it, none left out and none added. Listings
(`ls`) are shown this way, so a file that a change adds to the listed folder fails here
until the page shows it.
Steps that need a cluster are marked `<!-- not run: why; which test covers it -->` (checked
in tests/test_docs.py) and are not run; the test stands in for the
tutorial's environment step by putting the project's command on PATH (`python -m <slug>`
with `src/` on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engines import Bake

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
RUN, EXPECT, EXPECT_EXACT = "<!-- run -->", "<!-- expect -->", "<!-- expect exact -->"
WRITE = re.compile(r"<!-- write (\S+) -->")
TESTED_TAG = "▶ tested"
SLUG = "digits_workshop"  # the slug of the tutorial's project name
STEP_TIMEOUT = 240


@dataclass
class Step:
    """One executed block of the tutorial."""

    line: int  # 1-based line of the run marker
    section: str
    command: str
    expected: list[str] = field(default_factory=list)
    exact: bool = False  # the expected lines are the whole output (`<!-- expect exact -->`)


def _fenced(lines: list[str], start: int) -> tuple[str, list[str], int]:
    """The fenced block at the first non-blank line from ``start``: (info, body, next line)."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    assert i < len(lines), f"line {start + 1}: a marker without a code block after it"
    opening = lines[i].strip()
    assert opening.startswith("```"), f"line {i + 1}: expected a code fence, got {opening!r}"
    body: list[str] = []
    i += 1
    while lines[i].strip() != "```":
        body.append(lines[i])
        i += 1
    return opening[3:].strip(), body, i + 1


def parse_steps(text: str) -> list[Step]:
    """The run blocks of the tutorial with their expected output, in document order."""
    lines = text.splitlines()
    steps: list[Step] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() == RUN:
            info, body, i = _fenced(lines, i + 1)
            assert info == "bash", f"line {i}: a run block must be bash, not {info!r}"
            steps.append(Step(line=i, section=section, command="\n".join(body)))
            continue
        if written := WRITE.fullmatch(line.strip()):
            path = written.group(1)
            _, body, i = _fenced(lines, i + 1)
            text = "\n".join(body)
            command = (
                f"mkdir -p \"$(dirname {path})\" && cat > {path} <<'__PAGE__'\n{text}\n__PAGE__"
            )
            steps.append(Step(line=i, section=section, command=command))
            continue
        if line.strip() in {EXPECT, EXPECT_EXACT}:
            assert steps, f"line {i + 1}: expected output before any run block"
            exact = line.strip() == EXPECT_EXACT
            info, body, i = _fenced(lines, i + 1)
            assert info == "text", f"line {i}: an expect block must be text, not {info!r}"
            steps[-1].expected = [b for b in body if b.strip()]
            steps[-1].exact = exact
            continue
        i += 1
    return steps


_NUMBER = re.compile(r"\d+(\.\d+)?([eE][+-]?\d+)?")


def _normal(text: str) -> str:
    return " ".join(_NUMBER.sub("#", text).split())


def missing_lines(expected: list[str], output: str) -> list[str]:
    """Expected lines not found, in order, in the output (see the module docstring)."""
    out = [_normal(line) for line in output.splitlines()]
    missing: list[str] = []
    cursor = 0
    for want in expected:
        parts = [p for p in (_normal(part) for part in want.split("…")) if p]
        for index in range(cursor, len(out)):
            position = 0
            for part in parts:
                position = out[index].find(part, position)
                if position < 0:
                    break
                position += len(part)
            else:
                cursor = index + 1
                break
        else:
            missing.append(want)
    return missing


def _whole_line(want: str) -> re.Pattern[str]:
    """A pattern for a normalised output line that matches ``want`` from start to end."""
    return re.compile(".*".join(re.escape(_normal(part)) for part in want.split("…")))


def unmatched_lines(expected: list[str], output: str) -> list[str]:
    """Differences between the expected lines and the whole output (``expect exact``)."""
    out = [line for line in output.splitlines() if line.strip()]
    problems = [
        f"line {number}: {got!r}, expected {want!r}"
        for number, (want, got) in enumerate(zip(expected, out, strict=False), 1)
        if not _whole_line(want).fullmatch(_normal(got))
    ]
    problems += [f"missing: {want!r}" for want in expected[len(out) :]]
    problems += [f"not shown on the page: {got!r}" for got in out[len(expected) :]]
    return problems


def output_problems(step: Step, output: str) -> list[str]:
    """What the page shows for ``step`` but its output lacks (or, if exact, what differs)."""
    if step.exact:
        return unmatched_lines(step.expected, output)
    return missing_lines(step.expected, output)


STEPS = parse_steps(TUTORIAL.read_text("utf-8"))


def pre_commit_home() -> str:
    """The pre-commit cache of the user running the tests, where pre-commit looks for it."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return os.environ.get("PRE_COMMIT_HOME") or str(Path(cache) / "pre-commit")


class Tutorial:
    """Runs the steps in order, once per test session, remembering each one's outcome."""

    def __init__(
        self,
        template: Path,
        work: Path,
        steps: list[Step] = STEPS,
        project: Path | None = None,
    ) -> None:
        """Prepare a home, a bin folder with the project's command and a working folder.

        Without ``project`` the steps start in an empty folder and generate the project
        themselves (the tutorial); with it they start inside that project (how-tos).
        """
        self.template = template
        self.steps = steps
        slug = project.name if project else SLUG
        self.cwd = project or work / "work"
        self.cwd.mkdir(exist_ok=True)
        home, bindir = work / "home", work / "bin"
        home.mkdir()
        bindir.mkdir()
        command = bindir / slug
        command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {slug} "$@"\n', "utf-8")
        command.chmod(0o755)
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTHON"))}
        self.env = {
            **keep,
            "HOME": str(home),
            "PATH": f"{bindir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(project / "src" if project else self.cwd / SLUG / "src"),
            "PYTHONUNBUFFERED": "1",
            "MPLBACKEND": "Agg",
            # matplotlib's font cache from the real home: a fresh one costs seconds per step.
            "MPLCONFIGDIR": os.environ.get(
                "MPLCONFIGDIR", str(Path.home() / ".config" / "matplotlib")
            ),
            # pre-commit's hook environments from the real cache, as in a course's shared one
            # (the tutorial's "For instructors"): a first commit in the fresh home would
            # build them all from the package index, for every test session.
            "PRE_COMMIT_HOME": pre_commit_home(),
            "GIT_TERMINAL_PROMPT": "0",
        }
        self.state = work / "pwd"
        self.results: list[subprocess.CompletedProcess[str]] = []

    def run_through(self, index: int) -> subprocess.CompletedProcess[str]:
        """Run every step up to ``index`` not yet run; return that step's outcome."""
        while len(self.results) <= index:
            step = self.steps[len(self.results)]
            if self.results and self.results[-1].returncode != 0:
                pytest.fail(
                    f"an earlier step (line {self.steps[len(self.results) - 1].line}) failed"
                )
            script = step.command.replace("<template-url>", str(self.template))
            script += f'\n__rc=$?\npwd > "{self.state}"\nexit $__rc\n'
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # one stream, in the order it was written
                text=True,
                timeout=STEP_TIMEOUT,
                check=False,
            )
            self.cwd = Path(self.state.read_text("utf-8").strip())
            self.results.append(done)
        return self.results[index]


@pytest.fixture(scope="module")
def tutorial(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Tutorial:
    return Tutorial(template, tmp_path_factory.mktemp("tutorial"))


def test_tutorial_has_tested_steps() -> None:
    assert len(STEPS) >= 8
    assert all(step.expected for step in STEPS), "every run block shows its expected output"


def test_sections_are_labelled_by_what_runs() -> None:
    """A section is tagged '▶ tested' exactly when it has run blocks."""
    text = TUTORIAL.read_text("utf-8")
    headings = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    with_runs = {step.section for step in STEPS}
    for heading in headings:
        if heading in with_runs:
            assert TESTED_TAG in heading or "tested twin" in heading, heading
        else:
            assert TESTED_TAG not in heading, f"{heading!r} is tagged but runs nothing"


def test_matcher_is_strict_about_words_and_order() -> None:
    output = "run a: resumed from step 100 (epoch 9)\nwhere the time went:\n"
    assert missing_lines(["run …: resumed from step 7 (epoch 1)", "where the time"], output) == []
    assert missing_lines(["where the time", "resumed from"], output) == ["resumed from"]
    assert missing_lines(["started fresh"], output) == ["started fresh"]


def test_exact_matcher_wants_every_line_and_no_other() -> None:
    listing = "runs/a:\ncheckpoints\nrun_id\n\nruns/a/checkpoints:\nstep-000000110.pt\n"
    shown = ["runs/a:", "checkpoints", "run_id", "runs/…/checkpoints:", "step-000000007.pt"]
    assert unmatched_lines(shown, listing) == []
    assert unmatched_lines([line for line in shown if line != "run_id"], listing)
    assert unmatched_lines([*shown, "summary.json"], listing) == ["missing: 'summary.json'"]
    assert unmatched_lines(["runs/a:", "checkpoint", *shown[2:]], listing)  # a whole line
    # Parsed from a page: the marker sets the mode of the step before it.
    page = "\n".join(
        ["<!-- run -->", "```bash", "ls", "```", "<!-- expect exact -->", "```text", "a", "```"]
    )
    (step,) = parse_steps(page)
    assert step.exact
    assert step.expected == ["a"]


def test_listings_are_checked_exactly() -> None:
    """A run block that lists folders shows the whole listing (`<!-- expect exact -->`)."""
    for step in STEPS:
        lists = any(line.split()[:1] == ["ls"] for line in step.command.splitlines())
        assert step.exact or not lists, f"line {step.line}: an `ls` block needs expect exact"


@pytest.mark.slow
@pytest.mark.parametrize(
    "index", range(len(STEPS)), ids=[f"line{s.line}-{s.command.split()[0]}" for s in STEPS]
)
def test_step(tutorial: Tutorial, index: int) -> None:
    step = STEPS[index]
    done = tutorial.run_through(index)
    assert done.returncode == 0, f"line {step.line}: exit {done.returncode}\n{done.stdout}"
    missing = output_problems(step, done.stdout)
    assert not missing, f"line {step.line}: not in the output: {missing}\n--- output\n{done.stdout}"


@pytest.mark.slow
def test_tutorial_model_is_trained_resumed_and_evaluated(tutorial: Tutorial) -> None:
    tutorial.run_through(len(STEPS) - 1)
    project = tutorial.cwd
    assert project.name == SLUG
    summary = json.loads((project / "runs/digits/summary.json").read_text("utf-8"))
    evaluation = json.loads((project / "runs/digits/evaluation.json").read_text("utf-8"))
    assert summary["status"] == "finished"
    assert summary["step"] == summary["total_steps"]
    assert evaluation["accuracy"] > 0.9  # chance is 0.1
    assert (project / "reports/figures/digits/confusion_matrix_test.png").stat().st_size > 0


# Phrases of the tutorial's cluster-only output (steps 9 and 10, not executable here) and
# the generated file that prints each one: a change of wording in the code fails here until
# the tutorial shows the new output.
CLUSTER_OUTPUT = [
    (", restart ", "slurm/common.sh"),
    ("launch: ", "slurm/common.sh"),
    ("received SIG", "slurm/common.sh"),
    ("training step ended with exit code", "slurm/common.sh"),
    ("requeueing ", "slurm/common.sh"),
    ("of at most ", "slurm/common.sh"),
    ("stop signal (", "src/{slug}/engine/parallel/preemption.py"),
    ("): checkpoint at step ", "src/{slug}/engine/parallel/preemption.py"),
    (" written, exit", "src/{slug}/engine/parallel/preemption.py"),
    (": resumed from step ", "src/{slug}/engine/loop/trainer.py"),
    (" process(es) via ", "src/{slug}/engine/loop/trainer.py"),
    ("capability ", "src/{slug}/ops/doctor.py"),
    ("bf16     ", "src/{slug}/ops/doctor.py"),
    (", partition ", "src/{slug}/ops/doctor.py"),
]


def test_cluster_output_shown_matches_the_code(default_bake: Bake) -> None:
    text = TUTORIAL.read_text("utf-8")
    project = default_bake.project
    for phrase, rel in CLUSTER_OUTPUT:
        source = (project / rel.format(slug=project.name)).read_text("utf-8")
        assert phrase in text, f"the tutorial no longer shows {phrase!r}: drop it here"
        assert phrase in source, f"{rel} no longer prints {phrase!r}: update docs/tutorial.md"


# How-to pages may mark runnable blocks too; they run inside a copy of the default bake.
HOWTOS = sorted(p for p in (ROOT / "docs" / "howto").glob("*.md") if RUN in p.read_text("utf-8"))


def run_page(
    page: Path, template: Path, default_bake: Bake, tmp_path: Path, before: str = ""
) -> None:
    """Run a page's blocks in a copy of the default bake (the page may be the bake's own).

    ``before``: commands a reader may have run in the project before the page (as line 0).
    """
    project = tmp_path / default_bake.project.name
    shutil.copytree(default_bake.project, project, symlinks=True)
    if page.is_relative_to(default_bake.project):
        page = project / page.relative_to(default_bake.project)
    steps = parse_steps(page.read_text("utf-8"))
    assert steps, f"{page.name}: no runnable blocks"
    steps = [Step(0, "before the page", before), *steps] if before else steps
    runner = Tutorial(template, tmp_path, steps, project)
    for index, step in enumerate(steps):
        done = runner.run_through(index)
        where = f"{page.name} line {step.line}"
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}"
        missing = output_problems(step, done.stdout)
        assert not missing, f"{where}: not in the output: {missing}\n--- output\n{done.stdout}"


@pytest.mark.slow
@pytest.mark.parametrize("page", HOWTOS, ids=[p.stem for p in HOWTOS])
def test_howto_runnable_blocks(
    page: Path, template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    run_page(page, template, default_bake, tmp_path)


@pytest.mark.slow
def test_generated_task_guide_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's own guide to writing a task (docs/bring-your-own-task.md)."""
    run_page(
        default_bake.project / "docs" / "bring-your-own-task.md", template, default_bake, tmp_path
    )


@pytest.mark.slow
def test_generated_lm_guide_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's language-model how-to (docs/fine-tune-lm.md): prepare, plan, train, export."""
    run_page(default_bake.project / "docs" / "fine-tune-lm.md", template, default_bake, tmp_path)


@pytest.mark.slow
def test_generated_sweep_guide_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's sweep how-to (docs/sweeps.md): the dry runs of grid, random and optuna."""
    run_page(default_bake.project / "docs" / "sweeps.md", template, default_bake, tmp_path)


@pytest.mark.slow
def test_generated_tutorial_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's own tutorial (docs/tutorial.md): prepare, train, stop, resume, compare.

    After the README's first screen, as a reader comes to it: a run of the README's `train`
    (named by the time; one epoch here) is in runs/, and the page's table holds its own two.
    """
    slug = default_bake.project.name
    readme = f"{slug} prepare && {slug} train train.epochs=1"
    page = default_bake.project / "docs" / "tutorial.md"
    run_page(page, template, default_bake, tmp_path, before=readme)


def test_some_howto_has_runnable_blocks() -> None:
    assert HOWTOS, "no how-to page marks a runnable block"


@pytest.mark.slow
def test_generated_compare_guide_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's `compare` guide (docs/compare-runs.md): a small sweep, one run resumed."""
    run_page(default_bake.project / "docs" / "compare-runs.md", template, default_bake, tmp_path)


@pytest.mark.slow
def test_generated_training_guide_runs_as_shown(
    template: Path, default_bake: Bake, tmp_path: Path
) -> None:
    """The project's training page (docs/training.md): two processes under torchrun on the CPU."""
    run_page(default_bake.project / "docs" / "training.md", template, default_bake, tmp_path)
