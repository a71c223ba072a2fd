"""cookiecutter and cruft load the early answer rules from here (``_extensions``).

cookiecutter imports a template's Jinja extensions by module name from the template's root
folder; the rules themselves live in ``hooks/pre_gen_project.py`` (``hooks/`` is no package,
and the name ``hooks`` could belong to an installed package), so this module loads that file
under a name no other package uses.

Named ``hpc_ml_template_answers`` since release 0.3.0. cruft update renders a project's
release and the newest one in one process, and Python keeps a module under the name it was
first imported by: under the old name (``hpc_ml_template_rules``), release 0.2.0's rules
would check the newest release's answers and refuse an option they do not know
(``_copy_without_render``). The rules of this module accept every option the rendered
template's own cookiecutter.json declares, so later releases can keep the name.
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
