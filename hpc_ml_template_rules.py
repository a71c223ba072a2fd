"""cookiecutter and cruft load the early answer rules from here (``_extensions``).

cookiecutter imports a template's Jinja extensions by module name from the template's root
folder; the rules themselves live in ``hooks/pre_gen_project.py`` (``hooks/`` is no package,
and the name ``hooks`` could belong to an installed package), so this module loads that file
under a name no other package uses.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "hpc_ml_template_answer_rules"
_FILE = Path(__file__).parent / "hooks" / "pre_gen_project.py"
_spec = importlib.util.spec_from_file_location(_NAME, _FILE)
assert _spec is not None and _spec.loader is not None
_rules = sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rules)

EarlyRules = _rules.EarlyRules
