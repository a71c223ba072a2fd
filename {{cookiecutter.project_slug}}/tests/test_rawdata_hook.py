"""The `raw-data-guard` pre-commit hook with real git, real pre-commit and real commits.

The hook definition is taken from the project's own `.pre-commit-config.yaml`, entry and all;
only its environment is this test's Python (`language: system`) instead of one that
pre-commit would build from the package index, so the tests run offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pre-commit (which brings PyYAML) is not installed")
pytest.importorskip("pre_commit", reason="pre-commit is not installed")
if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = next((ROOT / "src").glob("*/data/rawdata.py")).parent.parent.name
rawdata = import_module(f"{PACKAGE}.data.rawdata")

FILES = {"labels.csv": "id,label\n1,cat\n", "images/0001.txt": "pixels\n"}


def guard_only_config() -> str:
    """The project's pre-commit config reduced to the raw-data guard."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    guard = [hook for hook in hooks if hook["id"] == "raw-data-guard"]
    assert len(guard) == 1, "raw-data-guard missing from .pre-commit-config.yaml"
    guard[0]["language"] = "system"
    guard[0].pop("additional_dependencies", None)
    return yaml.safe_dump({"repos": [{"repo": "local", "hooks": guard}]})


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)


def commit(repo: Path, message: str) -> subprocess.CompletedProcess[str]:
    """`git commit`, with the hook's report (which git sends to stderr) in stdout."""
    command = ["git", "commit", "-q", "-m", message]
    return subprocess.run(
        command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )


def freeze_update(repo: Path) -> None:
    rawdata.freeze(repo / "data" / "raw", repo / rawdata.MANIFEST_PATH, update=True)


def write(path: Path, text: str) -> None:
    """Replace a (read-only) raw file the way a careless script would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_text(text, encoding="utf-8")


def make_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gitignore: str, *, writable: bool = False
) -> Path:
    """A git repository with frozen raw data and its manifest committed, the guard installed.

    ``writable`` leaves the raw files writable, as in a fresh clone or generated project.
    """
    project = tmp_path / "project"
    project.mkdir()
    bin_dir = str(Path(sys.executable).parent)
    for name, value in {
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),  # the hook's `python`
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.org",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.org",
        "PROJECT_ROOT": str(project),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.chdir(project)
    for rel, text in FILES.items():
        write(project / "data" / "raw" / rel, text)
    (project / ".pre-commit-config.yaml").write_text(guard_only_config(), encoding="utf-8")
    (project / "src").symlink_to(ROOT / "src")  # the hook imports the package from src/
    (project / ".gitignore").write_text(gitignore, encoding="utf-8")
    assert git(project, "init", "-q", "-b", "main").returncode == 0
    install = [sys.executable, "-m", "pre_commit", "install"]
    subprocess.run(install, cwd=project, check=True, capture_output=True)
    rawdata.freeze(project / "data" / "raw", project / rawdata.MANIFEST_PATH, update=False)
    if writable:
        for rel in FILES:
            (project / "data" / "raw" / rel).chmod(0o644)
    git(project, "add", "-A")
    first = commit(project, "Frozen raw data")
    assert first.returncode == 0, first.stdout
    return project


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Raw data versioned in git, as some projects with small data sets do."""
    return make_repo(tmp_path, monkeypatch, "/data/.raw-cache.json\n")


@pytest.fixture
def ignored_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Raw data kept out of git by the project's own .gitignore (the default)."""
    gitignore = (ROOT / ".gitignore").read_text(encoding="utf-8")
    return make_repo(tmp_path, monkeypatch, gitignore)


def test_changed_raw_file_is_refused_until_freeze_update(repo: Path) -> None:
    write(repo / "data" / "raw" / "labels.csv", "id,label\n1,cow\n")
    git(repo, "add", "data/raw/labels.csv")
    refused = commit(repo, "Fix a label by hand")
    assert refused.returncode != 0
    assert "data/raw/labels.csv is staged but data/raw.manifest.tsv is not" in refused.stdout
    assert git(repo, "rev-list", "--count", "HEAD").stdout.strip() == "1"

    freeze_update(repo)
    git(repo, "add", "data/raw.manifest.tsv")
    accepted = commit(repo, "New labels, recorded")
    assert accepted.returncode == 0, accepted.stdout
    changed = git(repo, "show", "--name-only", "--format=", "HEAD").stdout.split()
    assert changed == ["data/raw.manifest.tsv", "data/raw/labels.csv"]


@pytest.mark.parametrize("action", ["add", "delete"])
def test_added_or_deleted_raw_file_is_refused_until_freeze_update(repo: Path, action: str) -> None:
    if action == "add":
        write(repo / "data" / "raw" / "images" / "0002.txt", "more pixels\n")
        git(repo, "add", "data/raw/images/0002.txt")
        path = "data/raw/images/0002.txt"
    else:
        git(repo, "rm", "-q", "data/raw/images/0001.txt")  # pre-commit passes no such name
        path = "data/raw/images/0001.txt"
    refused = commit(repo, f"{action} a raw file")
    assert refused.returncode != 0
    assert f"{path} is staged but data/raw.manifest.tsv is not" in refused.stdout

    freeze_update(repo)
    git(repo, "add", "data/raw.manifest.tsv")
    accepted = commit(repo, f"{action} a raw file, recorded")
    assert accepted.returncode == 0, accepted.stdout


def test_hand_edited_manifest_is_refused(repo: Path) -> None:
    manifest = repo / "data" / "raw.manifest.tsv"
    lines = manifest.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1][:-64] + "0" * 64  # a sum that no raw file has
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    write(repo / "data" / "raw" / "labels.csv", "id,label\n1,cow\n")
    git(repo, "add", "data")
    refused = commit(repo, "Pretend the data did not change")
    assert refused.returncode != 0
    assert "data/raw/images/0001.txt: staged content differs" in refused.stdout
    assert "modified    data/raw/labels.csv" in refused.stdout


def test_staged_content_must_be_what_was_frozen(repo: Path) -> None:
    write(repo / "data" / "raw" / "labels.csv", "id,label\n1,cow\n")
    git(repo, "add", "data/raw/labels.csv")
    write(repo / "data" / "raw" / "labels.csv", "id,label\n1,owl\n")  # after staging
    freeze_update(repo)
    git(repo, "add", "data/raw.manifest.tsv")
    refused = commit(repo, "Half-staged raw data")
    assert refused.returncode != 0
    assert "data/raw/labels.csv: staged content differs from data/raw.manifest.tsv" in (
        refused.stdout
    )


def test_git_ignored_raw_data_is_checked_on_disk(ignored_repo: Path) -> None:
    repo = ignored_repo
    assert git(repo, "ls-files", "data/raw").stdout == ""  # the data itself is not in git
    write(repo / "data" / "raw" / "new.csv", "a,b\n")
    write(repo / "README.md", "Notes\n")
    git(repo, "add", "README.md")
    assert commit(repo, "Unrelated change").returncode == 0  # the hook is not `data verify`

    manifest = repo / "data" / "raw.manifest.tsv"
    manifest.write_text(manifest.read_text(encoding="utf-8") + "new.csv\t4\t0444\t" + "0" * 64)
    git(repo, "add", "data/raw.manifest.tsv")
    refused = commit(repo, "Hand-written manifest line")
    assert refused.returncode != 0
    assert "modified    data/raw/new.csv (content differs)" in refused.stdout

    freeze_update(repo)
    git(repo, "add", "data/raw.manifest.tsv")
    accepted = commit(repo, "Record new.csv")
    assert accepted.returncode == 0, accepted.stdout
    assert "new.csv" in git(repo, "show", "HEAD:data/raw.manifest.tsv").stdout


def test_writable_files_of_a_fresh_checkout_commit_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permissions are no part of a commit: only content must match the manifest."""
    repo = make_repo(tmp_path, monkeypatch, "/data/.raw-cache.json\n", writable=True)
    assert git(repo, "ls-files", "data").stdout.split() == [
        "data/raw.manifest.tsv",
        "data/raw/images/0001.txt",
        "data/raw/labels.csv",
    ]
