"""template-status over damaged records: a report, or one line naming the file; never more.

Hypothesis cuts the release record (``.hpc-ml-template.json``) or cruft's answers file
(``.cruft.json``) short, flips one of its bits, puts bytes into it that are not UTF-8, or puts
a value of the wrong type where a text or a number was; copier's answers file
(``.copier-answers.yml``), whose every line must be one ``key: value``, the same way. The tool
either reads the file as it now stands or ends with one line that names it, and changes
nothing in the project.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from engines import status_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if TYPE_CHECKING:
    from engines import Bake

EXAMPLES = settings(
    max_examples=25,
    deadline=None,  # each example clones the template: a loaded machine takes its time
    derandomize=True,  # a run here is the run in CI
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
VALUE = re.compile(rb'"[^"\\]*"|-?\d+')


status = status_tool()


def damage(original: bytes) -> st.SearchStrategy[bytes]:
    """The file cut short, one bit flipped, foreign bytes put in, or a value retyped."""
    end = len(original)
    values = [m.span() for m in VALUE.finditer(original)]
    cut = st.integers(0, end - 1).map(lambda i: original[:i])
    flip = st.tuples(st.integers(0, end - 1), st.integers(0, 7)).map(
        lambda at: original[: at[0]] + bytes([original[at[0]] ^ 1 << at[1]]) + original[at[0] + 1 :]
    )
    foreign = st.tuples(st.integers(0, end), st.sampled_from([b"\xff", b"\xe9", b"\x00"])).map(
        lambda at: original[: at[0]] + at[1] + original[at[0] :]
    )
    retyped = st.tuples(
        st.sampled_from(values), st.sampled_from([b"7", b"[]", b"{}", b"null", b'"x"'])
    ).map(lambda at: original[: at[0][0]] + at[1] + original[at[0][1] :])
    return st.one_of(cut, flip, foreign, retyped)


def files_below(root: Path) -> dict[Path, bytes]:
    return {
        p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts
    }


@pytest.fixture
def project(default_bake: Bake, template: Path, tmp_path: Path) -> Path:
    """The default project with a cruft answers file beside its release record, in git."""
    root = tmp_path / "project"
    shutil.copytree(default_bake.project, root, symlinks=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=template, capture_output=True, text=True, check=True
    ).stdout.strip()
    answers = json.loads((root / status.RECORD).read_text("utf-8"))["answers"]
    state = {"template": str(template), "commit": commit, "context": {"cookiecutter": answers}}
    (root / status.CRUFT_STATE).write_text(json.dumps(state, indent=2), "utf-8")
    return root


def as_copier(root: Path) -> None:
    """Put copier's answers file where cruft's was, as copier writes it."""
    state = json.loads((root / status.CRUFT_STATE).read_text("utf-8"))
    (root / status.CRUFT_STATE).unlink()
    lines = ["# Changes here will be overwritten by Copier; NEVER EDIT MANUALLY"]
    lines += [f"_commit: {state['commit']}", f"_src_path: {state['template']}"]
    answers = state["context"]["cookiecutter"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in sorted(answers.items())]
    (root / status.COPIER_ANSWERS).write_text("\n".join(lines) + "\n", "utf-8")


@pytest.mark.parametrize("name", [status.RECORD, status.CRUFT_STATE, status.COPIER_ANSWERS])
@EXAMPLES
@given(data=st.data())
def test_a_damaged_record_is_read_or_named(
    name: str, project: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, data: st.DataObject
) -> None:
    """The release record or cruft's answers file, damaged: a report, or one line naming it."""
    path = project / name
    if name == status.COPIER_ANSWERS and not path.exists():
        as_copier(project)
    whole = path.read_bytes()
    path.write_bytes(data.draw(damage(whole)))
    before = files_below(project)
    monkeypatch.chdir(project)
    capsys.readouterr()
    try:
        code = status.main([])
        after = files_below(project)
    finally:
        path.write_bytes(whole)  # the next example starts from the whole file
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == status.FAILED:
        assert len(err.splitlines()) == 1, err
        assert err.startswith("template-status: ") and str(project) in err, err
    else:
        assert err == "" and out.startswith("This project: "), (code, out, err)
    assert after == before


def test_a_copier_answers_file_with_long_and_listed_values_is_read(tmp_path: Path) -> None:
    """YAML folds a long value onto indented lines and writes lists as `- ` lines."""
    (tmp_path / status.COPIER_ANSWERS).write_text(
        "# Changes here will be overwritten by Copier; NEVER EDIT MANUALLY\n"
        "_commit: v0.2.0-3-gabc1234\n"
        "_src_path: gh:team/hpc-ml-template\n"
        "description: A long description of the project that YAML folds onto the line\n"
        "  below it, indented\n"
        'quoted: "a quoted value that goes on\n'
        '  below too"\n'
        "owned:\n"
        "- README.md\n"
        "- configs\n",
        "utf-8",
    )
    source, commit, _ = status.recorded_source(tmp_path)
    assert (source, commit) == ("gh:team/hpc-ml-template", "v0.2.0-3-gabc1234")
