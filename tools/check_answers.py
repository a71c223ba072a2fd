"""Check a config, rc or answers file someone handed you before an engine reads it.

One template route cannot be closed from inside the template: cruft runs none of its code
before it renders the values of a cookiecutter config or rc file and of ``--extra-context``
(``-E``), so a file that removes the answer rules (``_extensions: []``) and holds template
syntax runs that syntax. This command applies the same rules to the file without rendering
anything, and says which kind of file it read:

- a cookiecutter config or rc file (``default_context``): ``--config-file``,
  ``COOKIECUTTER_CONFIG``, ``~/.cookiecutterrc``;
- a cookiecutter replay file (answers under ``cookiecutter``): every answer checked as the
  pre-generation hook checks it;
- cruft's ``.cruft.json`` (answers under ``context``), which ``cruft update`` renders: an
  edited choice there is refused here, where cruft would stop in its own code;
- a plain mapping of answers: cruft's ``--extra-context-file``, copier's ``--data-file``.

Run it with the Python of the engine (it has jinja2, python-slugify and PyYAML), e.g.
``python3 tools/check_answers.py ~/.cookiecutterrc``. Exit 0 when every file passes, 1 when
one holds a refused value (one line each), 2 when one cannot be read.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

TEMPLATE = Path(__file__).resolve().parents[1]


def answer_rules() -> ModuleType:
    """The template's answer rules (hooks/pre_gen_project.py, read as a module)."""
    path = TEMPLATE / "hooks" / "pre_gen_project.py"
    spec = importlib.util.spec_from_file_location("hpc_ml_template_checked_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(path: Path) -> object:
    """The file's data: YAML (a superset of JSON), parsed without rendering anything."""
    import yaml  # noqa: PLC0415  (an engine's dependency, imported after the usage line)

    try:
        return yaml.safe_load(path.read_text("utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(" ".join(str(error).split())) from error


def check(data: object, rules: ModuleType) -> tuple[str, list[str]]:
    """The kind of file ``data`` is and the rules' messages for it."""
    if not isinstance(data, dict):
        return "file", ["must hold a mapping of answers or a cookiecutter config"]
    if "default_context" in data:
        return "config file", rules.check_default_context(data["default_context"])
    template = json.loads((TEMPLATE / "cookiecutter.json").read_text("utf-8"))
    if isinstance(answers := data.get("cookiecutter"), dict):  # a replay file: every answer
        return "replay file", rules.check_rendered(answers, template)
    context = data.get("context")
    if isinstance(context, dict) and isinstance(answers := context.get("cookiecutter"), dict):
        # cruft's .cruft.json: `cruft update` renders both releases with these answers
        return "cruft state", rules.check_rendered(answers, template)
    return "answers file", rules.check_config(data)


def main(argv: list[str] | None = None) -> int:
    """Check each file; print one line per refused value."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="config, rc or answers files")
    args = parser.parse_args(argv)
    try:
        rules = answer_rules()
    except ImportError as error:
        print(
            f"ERROR: {error.name} is missing: run this with your engine's Python", file=sys.stderr
        )
        return 2
    status = 0
    for path in args.files:
        try:
            data = read(path)
        except (OSError, UnicodeDecodeError, ValueError) as error:  # yaml's errors are these
            print(f"ERROR: cannot read {path}: {error}", file=sys.stderr)
            status = 2
            continue
        kind, errors = check(data, rules)
        for message in errors:
            print(f"ERROR: {message} ({kind} {path})", file=sys.stderr)
        if errors:
            status = max(status, 1)
        else:
            print(f"{path} ({kind}): every value passes the template's rules")
    return status


if __name__ == "__main__":
    sys.exit(main())
