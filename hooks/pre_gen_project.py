"""The answer rules of hpc-ml-template: the only place where answers are validated.

One file serves every engine:

* cookiecutter and cruft render this file and run it as the pre-generation hook; the
  ``__main__`` block at the bottom holds the only template expression in the file and
  receives all answers as JSON. A rejected answer exits 1 before anything is written.
* copier imports the file unrendered (``_jinja_extensions`` in ``copier.yml``) and the
  ``Validation`` extension turns the rules into the ``hpc_check`` filter that each question's
  ``validator:`` calls, so copier re-prompts on a bad answer.

Each rule returns an empty string for a good value, else one line that names the field,
the value and the rule. Keep template delimiters (braces followed by a percent sign, a hash
or a second brace) out of this file: cookiecutter renders it before running it.
"""

from __future__ import annotations

import json
import keyword
import re
import sys
import tomllib
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Packages the generated project imports or installs: a slug equal to one of them would
# shadow it on sys.path and break the project in confusing ways.
PROJECT_DEPENDENCIES = frozenset(
    {
        "torch", "dotenv", "tqdm", "matplotlib", "numpy", "tensorboard", "pytest", "ruff",
        "setuptools", "pip", "pre_commit", "nvitop", "pynvml", "snakemake", "PIL", "yaml",
        "typing_extensions", "jinja2", "packaging", "wheel", "tests", "src", "data",
    }
)

_SLUG = re.compile(r"[a-z][a-z0-9_]*")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# Slurm names end up unquoted in #SBATCH lines: letters, digits and . _ - only (plus : for
# partitions such as grete:shared and commas for a list of partitions).
_ACCOUNT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_PARTITION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*(,[A-Za-z0-9_][A-Za-z0-9_.:-]*)*")
_MEMORY = re.compile(r"[0-9]+[KMGT]?")
# Slurm --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "time formats").
_TIME = re.compile(
    r"(?P<days>[0-9]+)-(?P<dh>[0-9]{1,2})(:(?P<dm>[0-9]{1,2})(:(?P<ds>[0-9]{1,2}))?)?"
    r"|(?P<h>[0-9]+):(?P<m>[0-9]{1,2}):(?P<s>[0-9]{1,2})"
    r"|(?P<mm>[0-9]+)(:(?P<ss>[0-9]{1,2}))?"
)
# Characters that a shell or a TOML/YAML string would treat specially; none may reach an
# unquoted shell word. Free-text answers are escaped where they are written instead.
_SHELL_SPECIAL = set("\"'`$\\;&|<>()[]{}*?!~#\n\r\t ")
_TIME_FORMATS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"
MAX_NODES = 1024
MAX_CPUS_PER_GPU = 256


def _say(field: str, value: object, rule: str) -> str:
    """Format the one-line message shown for a rejected answer."""
    return f"{field} {str(value)!r}: {rule}"


def to_slug(name: str) -> str:
    """Derive a package name from a project name: ASCII lowercase words joined by '_'."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")


def parse_time(value: str) -> int | None:
    """Return a Slurm time limit in seconds, or None when the format is not one of Slurm's."""
    match = _TIME.fullmatch(value.strip())
    if not match:
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in g:
        h, m, s = g["dh"], g.get("dm", 0), g.get("ds", 0)
        if h > 23 or m > 59 or s > 59:
            return None
        return ((g["days"] * 24 + h) * 60 + m) * 60 + s
    if "h" in g:
        if g["m"] > 59 or g["s"] > 59:
            return None
        return (g["h"] * 60 + g["m"]) * 60 + g["s"]
    if g.get("ss", 0) > 59:
        return None
    return g["mm"] * 60 + g.get("ss", 0)


def _int(value: object) -> int | None:
    """Read an integer answer; engines pass numbers as strings (cookiecutter, cruft)."""
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _one_line_text(field: str, value: str, *, required: bool = True) -> str:
    if required and not value.strip():
        return _say(field, value, "must not be empty")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        return _say(field, value, "must be a single line without control characters")
    if len(value) > 200:
        return _say(field, value, "must be at most 200 characters")
    return ""


def _partitions_of(answers: Mapping[str, Any], presets: Mapping[str, Any]) -> list[dict]:
    """Limits of the chosen partitions that the preset declares (unknown ones have none)."""
    preset = presets.get(str(answers.get("cluster", "")), {})
    declared = preset.get("partitions", {})
    names = str(answers.get("partition", "")).split(",")
    return [declared[n] for n in names if n in declared]


def check_project_name(value: str, answers: Mapping, presets: Mapping) -> str:
    return _one_line_text("project_name", value)


def check_project_slug(value: str, answers: Mapping, presets: Mapping) -> str:
    if not _SLUG.fullmatch(value):
        return _say(
            "project_slug",
            value,
            "must be a lowercase Python identifier (a-z, 0-9, _; starting with a letter)",
        )
    if keyword.iskeyword(value) or keyword.issoftkeyword(value):
        return _say("project_slug", value, "is a Python keyword")
    if value in sys.stdlib_module_names:
        return _say("project_slug", value, "would shadow the standard-library module")
    if value in PROJECT_DEPENDENCIES:
        return _say("project_slug", value, "would shadow a package the project depends on")
    if len(value) > 50:
        return _say("project_slug", value, "must be at most 50 characters")
    return ""


def check_description(value: str, answers: Mapping, presets: Mapping) -> str:
    return _one_line_text("description", value)


def check_author_name(value: str, answers: Mapping, presets: Mapping) -> str:
    return _one_line_text("author_name", value)


def check_author_email(value: str, answers: Mapping, presets: Mapping) -> str:
    if not _EMAIL.fullmatch(value):
        return _say("author_email", value, "must look like name@example.org")
    return ""


def check_account(value: str, answers: Mapping, presets: Mapping) -> str:
    if value and not _ACCOUNT.fullmatch(value):
        return _say("account", value, "may hold only letters, digits, '.', '_' and '-'")
    return ""


def check_partition(value: str, answers: Mapping, presets: Mapping) -> str:
    if not _PARTITION.fullmatch(value):
        return _say(
            "partition",
            value,
            "must be partition names of letters, digits, '.', '_', ':', '-' separated by ','",
        )
    return ""


def check_nodes(value: str, answers: Mapping, presets: Mapping) -> str:
    nodes = _int(value)
    if nodes is None or not 1 <= nodes <= MAX_NODES:
        return _say("nodes", value, f"must be a whole number from 1 to {MAX_NODES}")
    return ""


def check_gpus_per_node(value: str, answers: Mapping, presets: Mapping) -> str:
    gpus = _int(value)
    if gpus is None or gpus < 1:
        return _say("gpus_per_node", value, "must be a whole number of at least 1")
    limits = [p["gpus_per_node"] for p in _partitions_of(answers, presets)]
    if limits and gpus > min(limits):
        return _say(
            "gpus_per_node",
            value,
            f"exceeds the {min(limits)} GPUs per node of partition {answers.get('partition')}"
            f" in preset {answers.get('cluster')}",
        )
    return ""


def check_cpus_per_gpu(value: str, answers: Mapping, presets: Mapping) -> str:
    cpus = _int(value)
    if cpus is None or not 1 <= cpus <= MAX_CPUS_PER_GPU:
        return _say("cpus_per_gpu", value, f"must be a whole number from 1 to {MAX_CPUS_PER_GPU}")
    return ""


def check_memory(value: str, answers: Mapping, presets: Mapping) -> str:
    if not _MEMORY.fullmatch(value):
        return _say("memory", value, "must be a Slurm size: a whole number with K, M, G or T")
    return ""


def check_time_limit(value: str, answers: Mapping, presets: Mapping) -> str:
    seconds = parse_time(value)
    if seconds is None:
        return _say("time_limit", value, f"is not a Slurm time ({_TIME_FORMATS})")
    if seconds < 60:
        return _say("time_limit", value, "must be at least one minute")
    for limits in _partitions_of(answers, presets):
        if seconds > (parse_time(limits["max_time"]) or 0):
            return _say(
                "time_limit",
                value,
                f"exceeds the maximum {limits['max_time']} of partition "
                f"{answers.get('partition')} in preset {answers.get('cluster')}",
            )
    return ""


def check_mail(value: str, answers: Mapping, presets: Mapping) -> str:
    if value and not _EMAIL.fullmatch(value):
        return _say("mail", value, "must be empty or look like name@example.org")
    return ""


RULES: dict[str, Callable[[str, Mapping, Mapping], str]] = {
    "project_name": check_project_name,
    "project_slug": check_project_slug,
    "description": check_description,
    "author_name": check_author_name,
    "author_email": check_author_email,
    "account": check_account,
    "partition": check_partition,
    "nodes": check_nodes,
    "gpus_per_node": check_gpus_per_node,
    "cpus_per_gpu": check_cpus_per_gpu,
    "memory": check_memory,
    "time_limit": check_time_limit,
    "mail": check_mail,
}
# Answers that reach shell scripts unquoted (#SBATCH lines, which Slurm never expands).
SHELL_WORDS = ("account", "partition", "nodes", "gpus_per_node", "cpus_per_gpu", "memory",
               "time_limit", "mail", "project_slug")


def check(field: str, value: object, answers: Mapping, presets: Mapping) -> str:
    """Run the rule of one field; the shell-safety rule backs up every shell word."""
    text = str(value)
    message = RULES[field](text, answers, presets) if field in RULES else ""
    if not message and field in SHELL_WORDS and _SHELL_SPECIAL & set(text):
        message = _say(field, text, "must not contain quotes, spaces or shell metacharacters")
    return message


def validate(answers: Mapping[str, Any], presets: Mapping[str, Any]) -> list[str]:
    """Check all answers; return one message per rejected field, in question order."""
    return [m for field in answers if (m := check(field, answers[field], answers, presets))]


def load_presets(folder: Path) -> dict[str, dict]:
    """Read ``presets/<name>.toml`` files into a dict keyed by preset name."""
    return {p.stem: tomllib.loads(p.read_text("utf-8")) for p in sorted(folder.glob("*.toml"))}


try:  # copier side: only importable where Jinja is installed, which is always true there.
    from jinja2 import pass_context
    from jinja2.ext import Extension
except ImportError:  # pragma: no cover - cookiecutter always ships Jinja
    Extension = object  # type: ignore[assignment,misc]
else:

    class Validation(Extension):
        """Copier extension: the ``hpc_check`` and ``slugify`` filters."""

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            presets = load_presets(Path(__file__).resolve().parent.parent / "presets")

            @pass_context
            def hpc_check(context: Any, value: object, field: str) -> str:
                answers = {k: context.get(k) for k in ("cluster", "partition")}
                return check(field, value, answers, presets)

            def slugify(value: str, separator: str = "_") -> str:
                return to_slug(value).replace("_", separator)

            environment.filters["hpc_check"] = hpc_check
            environment.filters.setdefault("slugify", slugify)


def main(answers: dict[str, Any]) -> int:
    """Cookiecutter/cruft entry: print every rejected answer, exit 1 if there is one."""
    errors = validate(answers, answers.get("_presets", {}))
    for message in errors:
        print(f"ERROR: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(json.loads(r"""{{ cookiecutter | tojson }}""")))
