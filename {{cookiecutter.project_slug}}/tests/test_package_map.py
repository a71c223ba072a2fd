"""The package's rooms keep their rules (docs/package-map.md), and old task imports still work.

Every import of every module is read from its source (nothing is imported to check it) and
resolved to the room it points at; a forbidden arrow fails with the module and the line.
"""

import ast
import sys
from pathlib import Path

import pytest

from conftest import PACKAGE, ROOT, pkg

SRC = ROOT / "src" / PACKAGE
WINGS = ("engine", "data", "observe", "experiments", "ops", "blocks", "tasks")
# The rooms each room may not import (docs/package-map.md says why).
FORBIDDEN = {
    "engine": {"tasks", "experiments", "ops", "blocks"},
    "data": {"engine", "observe", "experiments", "ops", "tasks", "blocks"},
    "observe": {"engine", "experiments", "ops", "tasks", "blocks"},
    "experiments": {"ops", "tasks", "blocks"},
    "ops": {"experiments", "tasks", "blocks"},
    "blocks": {"engine", "data", "observe", "experiments", "ops", "tasks", "task", "config"},
    "config": {"task", "task_kinds", "api", *WINGS},
    "errors": {"task", "task_kinds", "api", "config", "settings", *WINGS},
    "settings": {"task", "task_kinds", "api", "config", *WINGS},
}


def room(module: str) -> str:
    """The room of a package-relative module name: its wing, or the top-level module."""
    return module.partition(".")[0]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, package-relative module) of every import of the package in `path`."""
    package = list(path.relative_to(SRC).parent.parts)  # the package `path` belongs to
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
            if node.module:
                found.append((node.lineno, ".".join(target)))
            else:  # from . import a, b: each name is a module of that package
                found += [(node.lineno, ".".join([*target, a.name])) for a in node.names]
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names
            ]  # fmt: skip
            for name in names:
                if name and name.split(".")[0] == PACKAGE:
                    found.append((node.lineno, name.partition(".")[2]))
    return found


def modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_room_keeps_its_import_rules() -> None:
    broken = []
    for path in modules():
        rel = path.relative_to(SRC)
        source_room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for line, target in imports(path):
            if room(target) in FORBIDDEN.get(source_room, set()):
                broken.append(f"{rel}:{line} imports {target} ({source_room} may not)")
    assert not broken, "\n".join(broken)


# The engine's wings (engine/__init__.py) and what each may not import; the modules at the
# engine's top are its helpers (`optim`, `names`, `hooks`), which import no wing.
ENGINE_WINGS = ("loop", "state", "parallel")
ENGINE_FORBIDDEN = {"state": {"loop"}, "parallel": {"loop"}, "helpers": set(ENGINE_WINGS)}


def engine_room(module: str) -> str | None:
    """The engine wing of a package-relative module name, "helpers", or None outside it."""
    parts = module.split(".")
    if parts[0] != "engine" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ENGINE_WINGS else "helpers"


def test_the_engine_wings_keep_their_rules() -> None:
    """The state on disk never imports the loop, nor does the parallel layer, and the loop
    reaches the state by its front door only (`from ..state import ...`): the format on disk
    (checkpoint files, manifests, shards) is behind it."""
    broken = []
    for path in modules():
        rel = path.relative_to(SRC)
        source = engine_room(".".join(rel.with_suffix("").parts))
        for line, target in imports(path):
            wing = engine_room(target)
            if source is None or wing is None:
                continue
            if wing in ENGINE_FORBIDDEN.get(source, set()):
                broken.append(f"{rel}:{line} imports {target} ({source} may not)")
            if source == "loop" and target.startswith("engine.state."):
                broken.append(f"{rel}:{line} imports {target} (the loop: `from ..state import`)")
    assert not broken, "\n".join(broken)
    for wing in ENGINE_WINGS:
        doc = ast.get_docstring(ast.parse((SRC / "engine" / wing / "__init__.py").read_text()))
        assert doc and "Owns:" in doc and "May import:" in doc, f"engine/{wing}/__init__.py"


def test_the_map_names_every_room_and_no_module_is_loose() -> None:
    """Each wing says what it holds and may import; the top level holds only the seam."""
    for wing in WINGS[:-1]:
        doc = ast.get_docstring(ast.parse((SRC / wing / "__init__.py").read_text("utf-8")))
        assert doc and "May import" in doc, f"{wing}/__init__.py does not say what it may import"
    top = {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
    seam = {"api", "cli", "config", "errors", "models", "settings", "task", "task_kinds"}
    assert top == seam, f"modules at the top that belong in a wing: {sorted(top - seam)}"
    page = (ROOT / "docs" / "package-map.md").read_text(encoding="utf-8")
    assert all(f"`{wing}/`" in page for wing in WINGS), "docs/package-map.md misses a wing"


# The tasks the template ships.
SHIPPED_TASKS = ("digits", "images", "lm", "hub_lm", "regression", "my_task")


def test_shipped_tasks_import_only_the_api() -> None:
    """A task imports `api` (and may build on another task), nothing else of the package."""
    shipped = [SRC / "tasks" / f"{name}.py" for name in SHIPPED_TASKS]
    assert any(path.is_file() for path in shipped)
    for path in filter(Path.is_file, shipped):
        for line, target in imports(path):
            assert target == "api" or room(target) == "tasks", f"tasks/{path.name}:{line}: {target}"


def test_the_api_names_exist() -> None:
    api = pkg("api")
    assert all(hasattr(api, name) for name in api.__all__)


# A task as written against template release 0.2.0: every import path tasks used then.
OLD_TASK = """
from dataclasses import dataclass

import torch
from torch.utils.data import TensorDataset

from ..errors import DataError
from ..models import build_model
from ..task import Datasets, split_indices
from ..task_kinds import Classification
from ..shards import ShardReader, write_shards
from ..pretrained import read_weights
from ..transformer import LoRA
from ..data import processed_digest

USED = (DataError, ShardReader, write_shards, read_weights, LoRA, processed_digest)


@dataclass
class Options:
    samples: int = 96


class OldStyle(Classification):
    Options = Options

    def prepare(self, out_dir):
        raise DataError("made in memory")

    def datasets(self, data_dir):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.options.samples, 4, generator=generator)
        y = (x.sum(dim=1) > 0).long()
        self.classes = ["neg", "pos"]
        part = split_indices(len(y), 0.25, 0.25, seed=0)
        train, val, test = (TensorDataset(x[part[s]], y[part[s]]) for s in ("train", "val", "test"))
        return Datasets(train, val, test)

    def build_model(self):
        return build_model(self.cfg.model, (4,), 2)


TASK = OldStyle
"""


def test_a_task_written_for_release_0_2_is_told_each_removed_path_in_one_line(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Release 0.3.0 removed the old paths: the task is refused in one line that names each
    old import and its new place; with the imports changed as the line says, it trains."""
    (tmp_path / "old_style.py").write_text(OLD_TASK, encoding="utf-8")
    monkeypatch.setattr(pkg("tasks"), "__path__", [*pkg("tasks").__path__, str(tmp_path)])
    overrides = ["task.name=old_style", "train.epochs=2", "train.batch_size=24", "run.name=old"]
    overrides += ["run.progress=log", "run.figures=false", "data.verify_raw=false"]
    with pytest.raises(pkg("errors").ConfigError) as refused:
        pkg("task").load_config(None, overrides)
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"task.name: module {PACKAGE}.tasks.old_style")
    lines = OLD_TASK.splitlines()
    moved = {"..shards": "..data.shards", "..pretrained": "..data.pretrained"}
    moved |= {"..transformer": "..blocks.transformer"}
    for old, new in moved.items():
        line = next(i for i, text in enumerate(lines, 1) if f"from {old} import" in text)
        assert f"line {line}: {old} is now {new}" in said, said
    assert "processed_digest of ..data, now ..data.processed" in said, said

    fixed = [text for text in lines if not text.startswith(("from ..", "USED ="))]
    api = "from ..api import Classification, Datasets, DataError, build_model, split_indices"
    (tmp_path / "old_style.py").write_text("\n".join([api, *fixed]) + "\n", encoding="utf-8")
    sys.modules.pop(f"{PACKAGE}.tasks.old_style", None)
    try:
        result = pkg("engine.loop.trainer").train(pkg("task").load_config(None, overrides))
    finally:
        sys.modules.pop(f"{PACKAGE}.tasks.old_style", None)
    assert result.exit_code == 0, result
    assert (project / "runs" / "old" / "summary.json").is_file()
