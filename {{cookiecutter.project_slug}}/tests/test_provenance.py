"""Provenance: each start of a run records the code, data and machine behind it."""

import json
import subprocess
from pathlib import Path

from conftest import pkg

provenance = pkg("observe.provenance")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_record_names_commit_dirty_tree_manifest_job_and_versions(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    manifest = root / "data" / "raw.manifest.tsv"
    manifest.write_text("path\tsize\tsha256\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "one")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    run_dir = root / "runs" / "r1"
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "ggpu[01-02]", "HOME": "/x"}

    first = provenance.record(run_dir, root, env)
    (root / "notes.txt").write_text("uncommitted")  # the second segment runs a dirty tree
    second = provenance.record(run_dir, root, {**env, "SLURM_RESTART_COUNT": "1"})

    lines = [json.loads(ln) for ln in (run_dir / "provenance.jsonl").read_text().splitlines()]
    assert lines == [first, second]
    assert (first["commit"], first["dirty"]) == (head, False)
    assert (second["commit"], second["dirty"]) == (head, True)
    digest = provenance.file_digest(manifest)
    assert first["raw_manifest_sha256"] == digest and len(digest) == 64
    assert first["slurm"] == {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "ggpu[01-02]"}
    assert second["slurm"]["SLURM_RESTART_COUNT"] == "1"
    assert first["versions"]["torch"] and first["versions"]["python"]


def test_record_without_git_or_manifest_still_writes(tmp_path: Path) -> None:
    entry = provenance.record(tmp_path / "run", tmp_path, {})
    assert (entry["commit"], entry["dirty"], entry["raw_manifest_sha256"]) == (None, None, None)
    assert (tmp_path / "run" / "provenance.jsonl").is_file()
