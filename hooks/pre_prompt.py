"""cookiecutter: refuse a user config that would run code or switch the rules off, before a prompt.

A config file's ``default_context`` (``--config-file``, ``COOKIECUTTER_CONFIG``,
``~/.cookiecutterrc``) replaces the template's defaults, and cookiecutter renders them as
templates while it asks: ``x{{ cycler.__init__.__globals__.os.popen('id').read() }}`` would
run. The answer rules (``EarlyRules``) refuse such values before rendering, but a config file
can also remove them with ``_extensions: []``. This hook runs before cookiecutter reads the
config, so it reads the same file the same way and applies the answer rules' config check.

cookiecutter passes the hook no arguments: ``--config-file`` and ``--default-config`` are read
from the command line of the cookiecutter process that runs it (``/proc``, on Linux; elsewhere
only the environment's and the home folder's config are checked). cruft never runs this hook;
its ``--config-file`` values are checked by ``EarlyRules`` and the pre-generation hook.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import yaml


def command_line_options(argv: list[str]) -> tuple[str | None, bool]:
    """``--config-file`` and ``--default-config`` as cookiecutter's command line gives them."""
    config_file, default = None, False
    for index, arg in enumerate(argv):
        if arg == "--config-file" and index + 1 < len(argv):
            config_file = argv[index + 1]
        elif arg.startswith("--config-file="):
            config_file = arg.split("=", 1)[1]
        elif arg == "--default-config":
            default = True
    return config_file, default


def parent_argv() -> list[str]:
    """The command line of the process that runs this hook (empty where /proc is missing)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def load_rules() -> object:
    """The answer rules: the pre-generation hook beside this file, imported unrendered."""
    path = Path(__file__).with_name("pre_gen_project.py")
    spec = importlib.util.spec_from_file_location("hpc_ml_template_prompt_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_path(argv: list[str]) -> Path | None:
    """The config file cookiecutter reads, in its order (cookiecutter.config.get_user_config).

    ``--default-config`` reads none; then ``--config-file``, ``COOKIECUTTER_CONFIG`` and
    ``~/.cookiecutterrc`` if it exists. (Found here rather than by importing cookiecutter: a
    bake without a config file pays only the start of this hook.)
    """
    config_file, default = command_line_options(argv)
    if default:
        return None
    if config_file:
        # cookiecutter read a relative path from the folder it was started in, before it
        # moved into its copy of the template: the shell's PWD names that folder.
        return Path(os.environ.get("PWD", "."), config_file)
    if os.environ.get("COOKIECUTTER_CONFIG"):
        return Path(os.environ["COOKIECUTTER_CONFIG"])
    rc = Path("~/.cookiecutterrc").expanduser()
    return rc if rc.exists() else None


def main() -> int:
    """Print each refused config value as cookiecutter users see errors; 1 if there is one."""
    path = config_path(parent_argv())
    if path is None:
        return 0
    if not path.is_file():
        message = f"ERROR: cannot read {path} to check it (give --config-file as an absolute path)"
        print(message, file=sys.stderr)
        return 1
    config = yaml.safe_load(path.read_text("utf-8"))
    default_context = config.get("default_context") if isinstance(config, dict) else None
    if not default_context:
        return 0
    errors = load_rules().check_config(default_context)  # type: ignore[attr-defined]
    for message in errors:
        print(f"ERROR: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
