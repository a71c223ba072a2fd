"""cookiecutter, copier and cruft write byte-identical projects, odd answers included."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from engines import bake, ruff_problems, tree
from test_bake import COMBINATIONS

ODD = {
    "project_name": 'Jürgen\'s "Quoted" \\ Net ⚡',
    "project_slug": "odd_net",
    "description": "Ünïcode, 'apostrophes', \"quotes\", back\\slashes & <angles> — all fine",
    "author_name": 'Seán O\'Brien "Bob" \\ Ünsal',
    "author_email": "sean.o-brien+hpc@uni-goettingen.de",
}
CASES = {
    **{k: COMBINATIONS[k] for k in ("defaults", "generic-conda", "grete-apptainer")},
    "odd": ODD,
}


def _diff(left: dict[str, bytes], right: dict[str, bytes]) -> list[str]:
    names = sorted(set(left) | set(right))
    return [n for n in names if left.get(n) != right.get(n)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_copier_and_cookiecutter_trees_identical(case: str, template: Path, tmp_path: Path) -> None:
    answers = CASES[case]
    cc = bake("cookiecutter", template, tmp_path / "cc", answers)
    cp = bake("copier", template, tmp_path / "cp", answers)
    assert cc.ok, cc.stderr[-2000:]
    assert cp.ok, cp.stderr[-2000:]
    assert _diff(tree(cc.project), tree(cp.project)) == []
    assert (cp.project / ".copier-answers.yml").is_file()
    assert not (cc.project / ".copier-answers.yml").exists()
    for result in (cc, cp):
        assert "Next steps:" in result.stdout


@pytest.mark.parametrize("case", ["defaults", "odd"])
def test_cruft_tree_identical(case: str, template: Path, tmp_path: Path) -> None:
    cc = bake("cookiecutter", template, tmp_path / "cc", CASES[case])
    cr = bake("cruft", template, tmp_path / "cr", CASES[case])
    assert cr.ok, cr.stderr[-2000:]
    assert _diff(tree(cc.project), tree(cr.project)) == []
    assert (cr.project / ".cruft.json").is_file()
    assert "Next steps:" in cr.stdout


def test_odd_answers_yield_valid_files(template: Path, tmp_path: Path) -> None:
    result = bake("cookiecutter", template, tmp_path, ODD)
    assert result.ok, result.stderr[-2000:]
    meta = tomllib.loads((result.project / "pyproject.toml").read_text("utf-8"))["project"]
    assert meta["description"] == ODD["description"]
    assert meta["authors"] == [{"name": ODD["author_name"], "email": ODD["author_email"]}]
    assert ODD["project_name"] in (result.project / "README.md").read_text("utf-8")
    assert ODD["author_name"] in (result.project / "LICENSE").read_text("utf-8")
    assert ruff_problems(result.project) == ""
