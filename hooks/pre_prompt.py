"""cookiecutter: refuse a user config that could run code while cookiecutter asks.

cookiecutter renders every default it asks for as a template, the values of a user config's
``default_context`` included (``--config-file``, ``COOKIECUTTER_CONFIG``,
``~/.cookiecutterrc``): ``x{{ cycler.__init__.__globals__.os.popen('id').read() }}`` there
would run. The answer rules (``EarlyRules``) refuse such a value before it is rendered, but
the same file can switch them off with ``_extensions: []``. This hook is the one piece of the
template that runs before cookiecutter renders anything, so it reads the config cookiecutter
has read, the same way, and applies ``check_config`` of the answer rules to it.

cookiecutter passes a pre-prompt hook nothing: ``--config-file`` and ``--default-config``
come from the command line of the cookiecutter process that runs this hook (Linux ``/proc``;
elsewhere, and under cookiecutter's Python API, only ``COOKIECUTTER_CONFIG`` and
``~/.cookiecutterrc`` are checked). cruft never runs a pre-prompt hook.

cookiecutter runs this hook in a copy of the template folder that it only removes after a
successful bake: a refusal removes that copy itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# yaml, shutil and tempfile are imported where a config file or a refusal needs them: most
# bakes have neither, and this hook runs before every one (their imports were half its time).

if TYPE_CHECKING:
    from types import ModuleType

OWN_NAMES = {"cookiecutter", "cookiecutter.exe", "cookiecutter-script.py"}


def cookiecutter_options(argv: list[str]) -> tuple[str | None, bool]:
    """``--config-file`` and ``--default-config`` of a cookiecutter command line.

    Only a command line that runs cookiecutter's own CLI counts (a program that calls
    cookiecutter's Python API may have options of its own with these names, pytest has one).
    """
    start = next((i + 1 for i, arg in enumerate(argv[:3]) if Path(arg).name in OWN_NAMES), None)
    if start is None:
        return None, False
    config_file, default = None, False
    words = iter(argv[start:])
    for word in words:
        if word == "--":
            break
        if word == "--config-file":
            config_file = next(words, None)
        elif word.startswith("--config-file="):
            config_file = word.partition("=")[2]
        elif word == "--default-config":
            default = True
    return config_file, default


def parent_command_line() -> list[str]:
    """The command line of the cookiecutter process that runs this hook ([] without /proc)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode(errors="surrogateescape") for word in raw.split(b"\0") if word]


def config_path(argv: list[str]) -> Path | None:
    """The config file cookiecutter has read, found as ``get_user_config`` finds it.

    ``--default-config`` reads none; else ``--config-file``, else ``COOKIECUTTER_CONFIG``,
    else ``~/.cookiecutterrc`` if it exists.
    """
    config_file, default = cookiecutter_options(argv)
    if default:
        return None
    # cookiecutter read a relative path from the folder it was started in; it now works in
    # its copy of the template, and only the shell's PWD still names that folder.
    if config_file := config_file or os.environ.get("COOKIECUTTER_CONFIG"):
        return Path(os.environ.get("PWD", "."), config_file)
    rc = Path("~/.cookiecutterrc").expanduser()
    return rc if rc.is_file() else None


def answer_rules() -> ModuleType:
    """The answer rules: the pre-generation hook beside this file (unrendered, no template)."""
    path = Path(__file__).with_name("pre_gen_project.py")
    spec = importlib.util.spec_from_file_location("hpc_ml_template_config_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_errors(path: Path) -> list[str]:
    """The config's refused values ([] for a config without default_context)."""
    import yaml  # noqa: PLC0415  (cookiecutter reads its config with PyYAML: it is there)

    if not path.is_file():
        return [f"cannot find the config file {path} to check it; give its absolute path"]
    config = yaml.safe_load(path.read_text("utf-8"))  # cookiecutter has parsed it already
    default_context = config.get("default_context") if isinstance(config, dict) else None
    if not isinstance(default_context, dict) or not default_context:
        return []
    errors: list[str] = answer_rules().check_config(default_context)
    return errors


def remove_template_copy() -> None:
    """Remove the template copy this hook runs in, which cookiecutter leaves on a failure."""
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    copy = Path.cwd().resolve()
    base = copy.parent
    temp = Path(tempfile.gettempdir()).resolve()
    if base.parent == temp and base.name.startswith("cookiecutter") and (copy / "hooks").is_dir():
        os.chdir(temp)
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    """Print each refused config value as the answer rules say it; 1 if there is one."""
    path = config_path(parent_command_line())
    errors = config_errors(path) if path else []
    if not errors:
        return 0
    remove_template_copy()
    for message in errors:
        print(f"ERROR: {message} (config file {path})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
