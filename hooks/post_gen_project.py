"""After generation: the optional first commit and a short next-steps message.

cookiecutter runs this file (rendered) inside the new project; copier runs it unrendered as
a task on the first copy only, passing the answers as JSON in argv. Nothing is deleted here:
optional files are chosen by their file names, so every engine writes the same tree.

The first commit is made only on a first generation by cookiecutter or copier, and never
inside an existing git work tree. ``cruft update`` and ``copier update`` regenerate the
project in temporary folders to compute their diff; a repository created there would end
up in that diff, so both are recognised and skipped: copier does not run this task on
update, and under cruft the context lacks ``_output_dir``, which only plain cookiecutter
sets (cruft users commit with cruft's own workflow, see the next steps). During ``cruft
update`` the hook prints nothing: the next steps would name cruft's temporary folders.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

NEXT_STEPS = """
Created {name} in {path}

Next steps:
  cd {path}
On this computer (a laptop: no GPU needed):
{here}
On the cluster ({cluster}), in a clone of this repository on the login node:
{cluster_steps}
Read README.md for the rest; `make help` lists every command.
"""

# A laptop gets the small CPU-only torch wheel; `make install` would take the CUDA build the
# cluster needs (gigabytes). With apptainer the local .venv is CPU-only anyway and training
# runs in the image, which is built on the cluster.
HERE_INSTALL = {
    "venv": "make install-cpu      # .venv with CPU-only torch, the project, dev tools, git hooks",
    "conda": "make install-cpu      # ./.conda from environment.yml with CPU-only torch, git hooks",
    "uv": "make install-cpu      # uv sync with CPU-only torch: .venv, uv.lock, git hooks",
    "apptainer": "make install          # .venv with CPU-only torch: editor, tests, git hooks",
}
HERE_RUN = {
    "yes": "make data train       # prepare the example data and train right here (CPU)",
    "no": "make test             # the project's tests; then your data (data/README.md)",
}
CLUSTER_INSTALL = {
    "venv": "make install          # the same with the CUDA build of torch for its GPUs",
    "conda": "make install          # the same with the CUDA build of torch for its GPUs",
    "uv": "make install          # the same with the CUDA build of torch for its GPUs",
    "apptainer": "make container        # build the image (a job on a compute node)",
}
CLUSTER_RUN = {
    "yes": "make data submit      # prepare the data, then train as a job on a GPU node",
    "no": "make submit           # once data/raw holds your data and the task reads it",
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


def cruft_update_run(context: dict[str, Any], project: Path) -> bool:
    """True when cruft renders a release into a temporary folder to compute its update.

    cruft sets no ``_output_dir`` (plain cookiecutter does); ``cruft update`` renders into a
    fresh ``tempfile`` folder, where the next steps would name a folder about to be deleted.
    """
    parent = project.resolve().parent
    in_temp = parent.parent == Path(tempfile.gettempdir()).resolve()
    return "_output_dir" not in context and in_temp and parent.name.startswith("tmp")


def main(answers: dict[str, Any], *, may_commit: bool, quiet: bool = False) -> int:
    """Protect the raw data, make the first commit when asked and allowed, print next steps."""
    project = Path.cwd()
    protect_raw_data(project)
    remove_empty_optional_folders(project)
    if quiet:  # an update's rendering: nothing to commit, nothing to tell
        return 0
    if answers.get("git_init") == "yes":
        if may_commit:
            print(first_commit(project, answers["author_name"], answers["author_email"]))
        else:
            print("cruft makes no first commit: git init && git add -A && git commit")
    print(
        NEXT_STEPS.format(
            name=answers["project_name"],
            path=project,
            here=f"  {HERE_INSTALL[answers['environment']]}\n  {HERE_RUN[answers['example']]}",
            cluster=answers["cluster"],
            cluster_steps=(
                f"  {CLUSTER_INSTALL[answers['environment']]}\n  {CLUSTER_RUN[answers['example']]}"
            ),
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
    sys.exit(
        main(
            context,
            may_commit="_output_dir" in context,
            quiet=cruft_update_run(context, Path.cwd()),
        )
    )
