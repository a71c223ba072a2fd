"""After generation: the optional first commit and a short next-steps message.

cookiecutter runs this file (rendered) inside the new project; copier runs it unrendered as
a task on the first copy only, passing the answers as JSON in argv. Nothing is deleted here:
optional files are chosen by their file names, so every engine writes the same tree.

The first commit is made only on a first generation by cookiecutter or copier, and never
inside an existing git work tree. ``cruft update`` and ``copier update`` regenerate the
project in temporary folders to compute their diff; a repository created there would end
up in that diff, so both are recognised and skipped: copier does not run this task on
update, and under cruft the context lacks ``_output_dir``, which only plain cookiecutter
sets (cruft users commit with cruft's own workflow, see the next steps).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

NEXT_STEPS = """
Created {name} in {path}

Next steps:
  cd {path}
  {env}
  make data train       # {data}
  make submit           # the same training as a job on a GPU node of {cluster}
Read README.md for the rest; `make help` lists every command.
"""

ENV_COMMANDS = {
    "venv": "make install          # .venv with the project, its dev tools and git hooks",
    "conda": "make install          # conda prefix env ./.conda from environment.yml",
    "apptainer": "make container        # build the image (a job on a compute node)",
    "uv": "make install          # uv sync: .venv from pyproject.toml and uv.lock, git hooks",
}
DATA_STEP = {
    "yes": "prepare the example data and train right here (CPU or GPU)",
    "no": "once data/raw holds your data and data.py reads it (data/README.md)",
}
MANIFEST_COLUMNS = 4
# Folders whose every file is optional (chosen by its file name): both engines leave them
# empty when nothing in them was chosen, so they are removed then (deepest first).
OPTIONAL_FOLDERS = (
    ".github/workflows", ".github", ".vscode", "container",
    "workflow/profiles/slurm", "workflow/profiles", "workflow",
)  # fmt: skip
# The author defaults of cookiecutter.json: a --no-input bake keeps them silently.
PLACEHOLDER_EMAIL = "jane.doe@example.org"


def _git(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=False)


def first_commit(project: Path, author: str, email: str) -> str:
    """Initialise a repository with everything committed; return a one-line outcome."""
    if shutil.which("git") is None:
        return "git not found: run `git init` yourself."
    if _git(project, "rev-parse", "--is-inside-work-tree").returncode == 0:
        return "Inside an existing git work tree: no repository created."
    steps = (
        ("init", "-q"),
        ("add", "-A"),
        (
            "-c",
            f"user.name={author}",
            "-c",
            f"user.email={email}",
            "commit",
            "-q",
            "-m",
            "Initial commit from hpc-ml-template",
        ),
    )
    for args in steps:
        result = _git(project, *args)
        if result.returncode != 0:
            # All or nothing: no repository with staged files and no commit is left behind.
            shutil.rmtree(project / ".git", ignore_errors=True)
            reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
            verb = next(a for a in args if a in {"init", "add", "commit"})
            return f"No git repository created: git {verb} failed: {reason}"
    return "Initialised a git repository with a first commit."


def remove_empty_optional_folders(project: Path) -> None:
    """Remove the optional folders that nothing was generated into."""
    for name in OPTIONAL_FOLDERS:
        folder = project / name
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def protect_raw_data(project: Path) -> None:
    """Give shipped raw files the modes their manifest records (read-only).

    Engines write files with the default mode; without this the first `prepare` would warn
    that the raw data's permissions differ from the manifest. Columns: path, size, mode, sha256.
    """
    manifest = project / "data" / "raw.manifest.tsv"
    if not manifest.is_file():
        return
    for line in manifest.read_text("utf-8").splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) == MANIFEST_COLUMNS and (project / "data" / "raw" / fields[0]).is_file():
            (project / "data" / "raw" / fields[0]).chmod(int(fields[2], 8))


def main(answers: dict[str, Any], *, may_commit: bool) -> int:
    """Protect the raw data, make the first commit when asked and allowed, print next steps."""
    project = Path.cwd()
    protect_raw_data(project)
    remove_empty_optional_folders(project)
    if answers.get("git_init") == "yes":
        if may_commit:
            print(first_commit(project, answers["author_name"], answers["author_email"]))
        else:
            print("cruft makes no first commit: git init && git add -A && git commit")
    print(
        NEXT_STEPS.format(
            name=answers["project_name"],
            path=project,
            env=ENV_COMMANDS[answers["environment"]],
            data=DATA_STEP[answers["example"]],
            cluster=answers["cluster"],
        )
    )
    if answers.get("author_email") == PLACEHOLDER_EMAIL:
        print(
            f"Note: the author is the placeholder {answers['author_name']} <{PLACEHOLDER_EMAIL}>;"
            " put yours into pyproject.toml and LICENSE (and git config)."
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:  # copier task: answers in argv, runs on the first copy only
        sys.exit(main(json.loads(sys.argv[1]), may_commit=True))
    context = json.loads(r"""{{ cookiecutter | tojson }}""")
    sys.exit(main(context, may_commit="_output_dir" in context))
