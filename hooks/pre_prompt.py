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

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

# yaml, shutil and tempfile are imported where a config file or a refusal needs them: most
# bakes have neither, and this hook runs before every one (their imports were half its time).

if TYPE_CHECKING:
    from types import ModuleType

OWN_NAMES = {"cookiecutter", "cookiecutter.exe", "cookiecutter-script.py", "cookiecutter.__main__"}
# cookiecutter's options that take a value (the rest are flags): what follows them is no
# template and no answer.
VALUE_OPTIONS = {
    "-c", "--checkout", "--directory", "--replay-file", "-o", "--output-dir", "--config-file",
    "--debug-file", "--accept-hooks",
}  # fmt: skip


class Command(NamedTuple):
    """What a cookiecutter command line says about the answers it brings."""

    config_file: str | None  # --config-file
    default_config: bool  # --default-config: no config file is read
    extra: dict[str, str]  # key=value after the template
    replay_file: str | None  # --replay-file


def cookiecutter_command(argv: list[str]) -> Command:
    """The answer sources of a cookiecutter command line.

    Only a command line that runs cookiecutter's own CLI counts (a program that calls
    cookiecutter's Python API may have options of its own with these names, pytest has one).
    """
    start = next((i + 1 for i, arg in enumerate(argv[:3]) if Path(arg).name in OWN_NAMES), None)
    if start is None:
        return Command(None, False, {}, None)
    options: dict[str, str] = {}
    positional: list[str] = []
    words = iter(argv[start:])
    for word in words:
        name, equals, value = word.partition("=")
        if word == "--":
            positional += words
        elif word.startswith("-") and name in VALUE_OPTIONS:
            options[name] = value if equals else next(words, "")
        elif word.startswith("-"):
            options[word] = ""
        else:
            positional.append(word)
    extra = dict(word.split("=", 1) for word in positional[1:] if "=" in word)
    config_file, replay_file = options.get("--config-file"), options.get("--replay-file")
    return Command(config_file, "--default-config" in options, extra, replay_file)


def started_in(name: str) -> Path:
    """A path cookiecutter read relative to the folder it was started in.

    cookiecutter now works in its copy of the template; only the shell's PWD still names
    that folder.
    """
    return Path(os.environ.get("PWD", "."), name)


def parent_command_line() -> list[str]:
    """The command line of the cookiecutter process that runs this hook ([] without /proc)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode(errors="surrogateescape") for word in raw.split(b"\0") if word]


def config_path(command: Command) -> Path | None:
    """The config file cookiecutter has read, found as ``get_user_config`` finds it.

    ``--default-config`` reads none; else ``--config-file``, else ``COOKIECUTTER_CONFIG``,
    else ``~/.cookiecutterrc`` if it exists.
    """
    if command.default_config:
        return None
    if config_file := command.config_file or os.environ.get("COOKIECUTTER_CONFIG"):
        return started_in(config_file)
    rc = Path("~/.cookiecutterrc").expanduser()
    return rc if rc.is_file() else None


@functools.cache  # a config file and command-line answers: loaded once
def answer_rules() -> ModuleType:
    """The answer rules: the pre-generation hook beside this file (unrendered, no template)."""
    path = Path(__file__).with_name("pre_gen_project.py")
    spec = importlib.util.spec_from_file_location("hpc_ml_template_config_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_errors(path: Path) -> list[str]:
    """The config's refused values, each with the file named."""
    import yaml  # noqa: PLC0415  (cookiecutter reads its config with PyYAML: it is there)

    where = f"(config file {path})"
    if not path.is_file():
        return [f"cannot find the config file {path} to check it; give its absolute path"]
    config = yaml.safe_load(path.read_text("utf-8"))  # cookiecutter has parsed it already
    default_context = config.get("default_context") if isinstance(config, dict) else None
    errors: list[str] = answer_rules().check_default_context(default_context)
    return [f"{message} {where}" for message in errors]


def command_line_errors(extra: dict[str, str]) -> list[str]:
    """Choices on the command line outside their list (cookiecutter: a 26-line traceback)."""
    return [f"{message} (command line)" for message in answer_rules().check_choices(extra)]


def replay_gaps(path: Path) -> list[str]:
    """The answers a replay file lacks (cookiecutter would ask for them, then crash).

    It asks for a missing answer with only the other missing ones at hand, so a default that
    uses a recorded answer (``project_slug`` from ``project_name``) ends in a traceback.
    """
    try:
        recorded = json.loads(path.read_text("utf-8")).get("cookiecutter")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return [f"cannot read the replay file {path} as JSON with a 'cookiecutter' mapping"]
    template = json.loads(Path("cookiecutter.json").read_text("utf-8"))  # in the copy
    rule = "a replay file holds every answer; bake once without it to write a complete one"
    missing = [k for k in template if k != "__prompts__" and k not in recorded]
    return [f"{field}: missing from the replay file {path}; {rule}" for field in missing]


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
    """Print each refused config or command-line value as the rules say it; 1 if there is one."""
    command = cookiecutter_command(parent_command_line())
    path = config_path(command)
    errors = config_errors(path) if path else []
    errors += command_line_errors(command.extra) if command.extra else []
    errors += replay_gaps(started_in(command.replay_file)) if command.replay_file else []
    if not errors:
        return 0
    remove_template_copy()
    for message in errors:
        print(f"ERROR: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
