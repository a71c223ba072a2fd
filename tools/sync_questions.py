"""Keep the template's mirrors in step with their sources.

Sources: ``presets/*.toml`` (one file per cluster) and the questions in
``cookiecutter.json``. Generated from them:

* ``cookiecutter.json``: the ``_presets`` data and the ``cluster`` choices (default first);
* ``copier.yml``: the whole file, question by question (same names, defaults, choices and
  help texts), with each rule of ``hooks/pre_gen_project.py`` wired in as a validator, the
  template version (``_template_version``) and copier's ``_skip_if_exists`` from the files a
  generated project owns (``_project_owned``, the list cruft reads from the project's
  pyproject.toml).

Run ``python tools/sync_questions.py`` after changing a preset or a question;
``--check`` exits 1 when a mirror is stale (the test suite runs that).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
COOKIECUTTER_JSON = ROOT / "cookiecutter.json"
COPIER_YML = ROOT / "copier.yml"
DEFAULT_CLUSTER = "grete"
# cookiecutter's own keys: prompts, and the answers-file name that copier sets itself.
NOT_DERIVED = {"__prompts__", "__answers"}
# Plain data under the cookiecutter namespace, handed to copier's namespace as literals.
LITERALS = ("_template_version", "_project_owned")


def copier_skip_patterns(owned: list[str]) -> list[str]:
    """The project-owned patterns in the form copier reads.

    The list's patterns are relative to the project root (``*`` is one path segment, ``/**``
    everything below), which is how cruft reads them (``pathlib`` globs). copier matches
    gitignore-style, where a name without a slash matches at any depth (``README.md`` would
    also skip ``slurm/README.md``): a leading slash anchors each pattern at the root.
    """
    return [f"/{pattern}" for pattern in owned]


# Derived values whose cookiecutter expression has no copier twin: cookiecutter's `now` tag
# becomes a function of the template's Jinja extension (hooks/pre_gen_project.py).
COPIER_DERIVED = {"__year": "hpc_year()"}
# The answers hooks/post_gen_project.py reads (passed to it as a copier task).
POST_GEN_KEYS = (
    "project_name", "author_name", "author_email", "environment", "example", "cluster", "git_init",
)  # fmt: skip


def load_rules() -> Any:
    """Import the hook file as a module (it is plain Python apart from its main block)."""
    spec = importlib.util.spec_from_file_location("answer_rules", ROOT / "hooks/pre_gen_project.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_presets(folder: Path) -> dict[str, dict]:
    """Read ``presets/<name>.toml`` files into a dict keyed by preset name."""
    return {p.stem: tomllib.loads(p.read_text("utf-8")) for p in sorted(folder.glob("*.toml"))}


def synced_cookiecutter(current: dict[str, Any], presets: dict[str, Any]) -> dict[str, Any]:
    """Return cookiecutter.json with presets and cluster choices taken from presets/."""
    names = sorted(presets, key=lambda n: (n != DEFAULT_CLUSTER, n))
    updated = {"_presets": presets}
    updated.update({k: v for k, v in current.items() if k != "_presets"})
    updated["cluster"] = names
    return updated


def _copier_default(value: str) -> str:
    """Translate a cookiecutter default expression into copier's namespace."""
    value = value.replace("cookiecutter._presets", "presets")
    return re.sub(r"cookiecutter\.", "", value)


def _derived_expression(name: str, raw: str) -> str:
    """The copier expression of a derived value: the inside of its ``{{ ... }}``."""
    return COPIER_DERIVED.get(name) or _copier_default(raw).strip()[2:-2].strip()


def copier_text(cookiecutter: dict[str, Any], rules: Any) -> str:
    """Render the full copier.yml for the given cookiecutter.json content."""
    prompts = cookiecutter["__prompts__"]
    questions = [k for k in cookiecutter if not k.startswith("_")]
    head = {
        "_min_copier_version": "9.4",
        # copier renders this value itself, hence the raw block around the folder name.
        "_subdirectory": "{% raw %}{{cookiecutter.project_slug}}{% endraw %}",
        # Render every file, like cookiecutter does (copier's default renders only *.jinja).
        "_templates_suffix": "",
        "_answers_file": ".copier-answers.yml",
        # Files the project owns once generated: an update never overwrites them.
        "_skip_if_exists": copier_skip_patterns(cookiecutter["_project_owned"]),
        # cookiecutter fails on an undefined name; copier must too, or typos render empty.
        "_envops": {"undefined": "jinja2.StrictUndefined", "keep_trailing_newline": True},
        # The answer rules live in the cookiecutter hook; this loads them as Jinja filters.
        # Loading a Python extension is why copier needs --trust for this template.
        "_jinja_extensions": [
            "copier_template_extensions.TemplateExtensionLoader",
            "hooks/pre_gen_project.py:Validation",
        ],
        # Next steps and the optional first commit: the same script cookiecutter runs,
        # only on the first copy, never on update.
        "_tasks": [
            {
                "command": [
                    "{{ _copier_python }}",
                    "{{ _copier_conf.src_path }}/hooks/post_gen_project.py",
                    # Only what the script reads: copier prints the command it runs.
                    "{{ {" + ", ".join(f"'{k}': {k}" for k in POST_GEN_KEYS) + "} | tojson }}",
                ],
                "when": "{{ _copier_operation == 'copy' }}",
            }
        ],
        "presets": {
            "type": "json",
            "when": False,
            "help": "Cluster presets from presets/*.toml (never asked)",
            "default": json.dumps(cookiecutter["_presets"], sort_keys=True),
        },
    }
    body: dict[str, Any] = {}
    for name in questions:
        raw = cookiecutter[name]
        question: dict[str, Any] = {"type": "str", "help": prompts[name]}
        if isinstance(raw, list):
            question["choices"] = list(raw)
            question["default"] = raw[0]
        else:
            question["default"] = _copier_default(str(raw))
        if name in rules.RULES or name in rules.CONTEXT_RULES or name in rules.CHOICES:
            question["validator"] = f"{{{{ {name} | hpc_check('{name}') }}}}"
        body[name] = question
    # The cookiecutter.* namespace that the template files use, computed, never asked:
    # the answers, and the values cookiecutter derives from them ("__name": "{{ expr }}").
    derived = [k for k in cookiecutter if k.startswith("__") and k not in NOT_DERIVED]
    mapping = ", ".join(
        [f"'{n}': {n}" for n in questions]
        + [f"'{n}': ({_derived_expression(n, cookiecutter[n])})" for n in derived]
        + [f"'{n}': {json.dumps(cookiecutter[n])}" for n in LITERALS]
    )
    body["cookiecutter"] = {
        "type": "json",
        "when": False,
        "help": "The answers under the cookiecutter namespace (never asked)",
        "default": (
            f"{{{{ {{{mapping}, '_presets': presets, "
            "'__answers': _copier_conf.answers_file | string} | tojson }}"
        ),
    }
    header = (
        "# GENERATED by tools/sync_questions.py from cookiecutter.json and presets/*.toml.\n"
        "# Do not edit by hand: edit the sources and run `make sync`.\n"
    )
    dump = {"sort_keys": False, "allow_unicode": True, "width": 100}
    return header + yaml.safe_dump(head, **dump) + "\n" + yaml.safe_dump(body, **dump)


def main(argv: list[str] | None = None) -> int:
    """Write the mirrors, or with --check report which are stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    rules = load_rules()
    current = json.loads(COOKIECUTTER_JSON.read_text("utf-8"))
    cc = synced_cookiecutter(current, load_presets(ROOT / "presets"))
    wanted = {
        COOKIECUTTER_JSON: json.dumps(cc, indent=2, ensure_ascii=False) + "\n",
        COPIER_YML: copier_text(cc, rules),
    }
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text("utf-8") != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.name} (run `make sync`)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], "utf-8")
        print(f"wrote {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
