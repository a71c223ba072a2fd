"""The package under test, found by the name in pyproject.toml: for tests and benchmarks.

No pytest here: the benchmarks import it, and they run where only the package and its
runtime dependencies are installed (no dev tools).
"""

import importlib
import sys
from pathlib import Path
from types import ModuleType

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


def pkg(module: str) -> ModuleType:
    """A module of the package under test, e.g. pkg("config")."""
    return importlib.import_module(f"{PACKAGE}.{module}")
