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
import unicodedata
from typing import TYPE_CHECKING, Any

from jinja2 import pass_context
from jinja2.ext import Extension

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# Packages the generated project imports or installs: a slug equal to one of them would
# shadow it on sys.path and break the project in confusing ways.
# fmt: off
PROJECT_DEPENDENCIES = frozenset({
    "torch", "dotenv", "tqdm", "matplotlib", "numpy", "tensorboard", "pytest", "ruff",
    "setuptools", "pip", "pre_commit", "nvitop", "pynvml", "snakemake", "PIL", "yaml",
    "typing_extensions", "jinja2", "packaging", "wheel", "tomli", "tests", "src", "data",
})
# fmt: on

_SLUG = re.compile(r"[a-z][a-z0-9_]*")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# Slurm names end up unquoted in #SBATCH lines: letters, digits and . _ - only (plus : for
# partitions such as grete:shared and commas for a list of partitions).
_ACCOUNT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_PARTITION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*(,[A-Za-z0-9_][A-Za-z0-9_.:-]*)*")
# A size with its unit (a bare number would be megabytes), per node or per GPU ("16G/gpu").
_MEMORY = re.compile(r"[0-9]+[KMGT](/gpu)?")
# GPU type names as Slurm's GRES types and the snakemake executor accept them (A100, 1g.20gb).
_GPU_TYPE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
# Slurm --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "time formats").
_TIME = re.compile(
    r"(?P<days>[0-9]+)-(?P<dh>[0-9]{1,2})(:(?P<dm>[0-9]{1,2})(:(?P<ds>[0-9]{1,2}))?)?"
    r"|(?P<h>[0-9]+):(?P<m>[0-9]{1,2}):(?P<s>[0-9]{1,2})"
    r"|(?P<mm>[0-9]+)(:(?P<ss>[0-9]{1,2}))?"
)
# Characters that a shell or a TOML/YAML string would treat specially; none may reach an
# unquoted shell word. Free-text answers are escaped where they are written instead.
_SHELL_SPECIAL = set("\"'`$\\;&|<>()[]{}*?!~#\n\r\t ")
# Shell words are printable ASCII: no non-breaking space or other invisible character pasted
# from a web page, which Slurm's option parser rejects.
_PRINTABLE_ASCII = re.compile(r"[!-~]*")
_TIME_FORMATS = "M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"
MAX_NODES = 1024
MAX_GPUS = 64
MAX_CPUS_PER_GPU = 256
MAX_SLUG = 50
MAX_TEXT = 200
MAX_SEXAGESIMAL = 59
MAX_HOUR = 23
SNAKEMAKE_MIN_PYTHON = (3, 11)
MIN_TIME = 60  # seconds: Slurm counts in minutes


def _say(field: str, value: object, rule: str) -> str:
    """Format the one-line message shown for a rejected answer."""
    return f"{field} {str(value)!r}: {rule}"


def to_slug(name: str) -> str:
    """Derive a package name from a project name: ASCII lowercase words joined by '_'."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")


def parse_time(value: str) -> int | None:
    """Return a Slurm time limit in seconds, or None when the format is not one of Slurm's."""
    match = _TIME.fullmatch(value)
    if not match:
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in g:
        hours, minutes, seconds = g["dh"], g.get("dm", 0), g.get("ds", 0)
        days = g["days"]
    elif "h" in g:
        days, hours, minutes, seconds = 0, g["h"], g["m"], g["s"]
    else:
        days, hours, minutes, seconds = 0, 0, g["mm"], g.get("ss", 0)
    too_big = seconds > MAX_SEXAGESIMAL or (minutes > MAX_SEXAGESIMAL and "mm" not in g)
    if too_big or ("days" in g and hours > MAX_HOUR):
        return None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _int(value: str) -> int | None:
    """Read an integer answer; engines pass numbers as strings (cookiecutter, cruft)."""
    # int() would accept spaces and non-ASCII digits, which then reach a shell script.
    return int(value) if re.fullmatch(r"-?[0-9]+", value) else None


def _one_line_text(field: str, value: str) -> str:
    if not value.strip():
        return _say(field, value, "must not be empty")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        return _say(field, value, "must be a single line without control characters")
    if len(value) > MAX_TEXT:
        return _say(field, value, f"must be at most {MAX_TEXT} characters")
    return ""


def check_project_slug(value: str) -> str:
    """A lowercase identifier that shadows nothing the project imports."""
    if not _SLUG.fullmatch(value):
        rule = "must be a lowercase Python identifier (a-z, 0-9, _; starting with a letter)"
    elif keyword.iskeyword(value) or keyword.issoftkeyword(value):
        rule = "is a Python keyword"
    elif value in sys.stdlib_module_names:
        rule = "would shadow the standard-library module"
    elif value in PROJECT_DEPENDENCIES:
        rule = "would shadow a package the project depends on"
    elif len(value) > MAX_SLUG:
        rule = f"must be at most {MAX_SLUG} characters"
    else:
        return ""
    return _say("project_slug", value, rule)


def check_email(field: str, value: str, *, optional: bool = False) -> str:
    """An address of the usual name@domain.tld shape (empty allowed when optional)."""
    if (optional and not value) or _EMAIL.fullmatch(value):
        return ""
    return _say(
        field, value, ("must be empty or " if optional else "must ") + "look like name@example.org"
    )


def check_account(value: str) -> str:
    """Empty (the cluster's default account) or a safe Slurm name."""
    if value and not _ACCOUNT.fullmatch(value):
        return _say("account", value, "may hold only letters, digits, '.', '_' and '-'")
    return ""


def check_partition(value: str) -> str:
    """One partition name or a comma-separated list of them."""
    if not _PARTITION.fullmatch(value):
        rule = "must be partition names of letters, digits, '.', '_', ':', '-' separated by ','"
        return _say("partition", value, rule)
    return ""


def check_whole_number(field: str, value: str, low: int, high: int) -> str:
    """A whole number within [low, high]."""
    number = _int(value)
    if number is None or not low <= number <= high:
        return _say(field, value, f"must be a whole number from {low} to {high}")
    return ""


def _partitions_of(answers: Mapping[str, Any], presets: Mapping[str, Any]) -> list[dict]:
    """Limits of the chosen partitions that the preset declares (unknown ones have none)."""
    preset = presets.get(str(answers.get("cluster", "")), {})
    declared = preset.get("partitions", {})
    names = str(answers.get("partition", "")).split(",")
    return [declared[n] for n in names if n in declared]


# ------------------------------------------------------------------ cluster resources
# The rules that hold answers to the facts of the cluster preset (presets/*.toml): the GPU
# type of the chosen partitions, memory with its unit, cores per GPU within a node's share.


def check_gpu_type(value: str, answers: Mapping[str, Any], presets: Mapping[str, Any]) -> str:
    """An explicit GPU type, or one the preset knows for every chosen partition.

    A partition the preset does not list has no known type: requesting the wrong one makes a
    job that can never start, so that is an error (answer gpu_type), never a silent default.
    A partition list (`a,b`) lets Slurm pick either, so both must have the same type.
    """
    if value:
        if not _GPU_TYPE.fullmatch(value):
            return _say("gpu_type", value, "must be a Slurm GPU type such as A100 or 1g.20gb")
        return ""
    cluster = str(answers.get("cluster", ""))
    preset = presets.get(cluster, {})
    if not preset.get("gpu_type_required"):
        return ""
    declared = preset.get("partitions", {})
    names = str(answers.get("partition", "")).split(",")
    unknown = [n for n in names if not declared.get(n, {}).get("gpu_type")]
    if unknown:
        rule = (
            f"partition {unknown[0]} has no GPU type in preset {cluster} (known: "
            f"{', '.join(sorted(declared))}); answer gpu_type, e.g. A100 (see `sinfo -o '%P %G'`)"
        )
        return _say("gpu_type", value, rule)
    types = {n: declared[n]["gpu_type"] for n in names}
    if len(set(types.values())) > 1:
        listed = ", ".join(f"{n} ({t})" for n, t in types.items())
        rule = f"partitions {listed} differ in GPU type; list partitions of one type"
        return _say("gpu_type", value, rule + " or answer gpu_type")
    return ""


def check_memory(value: str) -> str:
    """A Slurm size with its unit, per node (64G) or per GPU (16G/gpu)."""
    if not _MEMORY.fullmatch(value):
        rule = "must be a whole number with a unit K, M, G or T"
        return _say("memory", value, rule + ", per node (64G) or per GPU (16G/gpu)")
    return ""


def check_cpus_per_gpu(value: str, answers: Mapping[str, Any], presets: Mapping[str, Any]) -> str:
    """At least one core, and no more than a GPU's share of the partition's node."""
    if message := check_whole_number("cpus_per_gpu", value, 1, MAX_CPUS_PER_GPU):
        return message
    for name, limits in _named_partitions(answers, presets):
        share = limits["cpus_per_node"] // limits["gpus_per_node"]
        if int(value) > share:
            rule = (
                f"exceeds the {share} cores per GPU of partition {name} in preset "
                f"{answers.get('cluster')} ({limits['cpus_per_node']} cores for "
                f"{limits['gpus_per_node']} GPUs per node)"
            )
            return _say("cpus_per_gpu", value, rule)
    return ""


def _named_partitions(
    answers: Mapping[str, Any], presets: Mapping[str, Any]
) -> list[tuple[str, dict]]:
    """(name, limits) of the chosen partitions that the preset declares."""
    preset = presets.get(str(answers.get("cluster", "")), {})
    declared = preset.get("partitions", {})
    return [(n, declared[n]) for n in str(answers.get("partition", "")).split(",") if n in declared]


def check_gpus_per_node(value: str, answers: Mapping[str, Any], presets: Mapping[str, Any]) -> str:
    """At least one GPU, and no more than the preset's node of that partition holds."""
    if message := check_whole_number("gpus_per_node", value, 1, MAX_GPUS):
        return message
    limits = [p["gpus_per_node"] for p in _partitions_of(answers, presets)]
    if limits and int(value) > min(limits):
        where = f"partition {answers.get('partition')} in preset {answers.get('cluster')}"
        return _say("gpus_per_node", value, f"exceeds the {min(limits)} GPUs per node of {where}")
    return ""


def check_time_limit(value: str, answers: Mapping[str, Any], presets: Mapping[str, Any]) -> str:
    """A Slurm time of at least a minute, within the preset partition's maximum."""
    seconds = parse_time(value)
    if seconds is None:
        return _say("time_limit", value, f"is not a Slurm time ({_TIME_FORMATS})")
    if seconds < MIN_TIME:
        return _say("time_limit", value, "must be at least one minute")
    for limits in _partitions_of(answers, presets):
        if seconds > (parse_time(limits["max_time"]) or 0):
            where = f"partition {answers.get('partition')} in preset {answers.get('cluster')}"
            return _say("time_limit", value, f"exceeds the maximum {limits['max_time']} of {where}")
    return ""


def check_snakemake(value: str, answers: Mapping[str, Any], _presets: Mapping[str, Any]) -> str:
    """The workflow needs snakemake 9, which runs on Python 3.11 and newer only."""
    version = tuple(int(p) for p in str(answers.get("python_version", "3.11")).split("."))
    if value == "yes" and version < SNAKEMAKE_MIN_PYTHON:
        return _say("snakemake", value, "needs python_version 3.11 or newer (snakemake 9)")
    return ""


# Field -> rule. Rules in CONTEXT_RULES also see the answers so far and the presets.
RULES: dict[str, Callable[[str], str]] = {
    "project_name": lambda v: _one_line_text("project_name", v),
    "project_slug": check_project_slug,
    "description": lambda v: _one_line_text("description", v),
    "author_name": lambda v: _one_line_text("author_name", v),
    "author_email": lambda v: check_email("author_email", v),
    "account": check_account,
    "partition": check_partition,
    "nodes": lambda v: check_whole_number("nodes", v, 1, MAX_NODES),
    "memory": check_memory,
    "mail": lambda v: check_email("mail", v, optional=True),
}
CONTEXT_RULES: dict[str, Callable[[str, Mapping[str, Any], Mapping[str, Any]], str]] = {
    "gpu_type": check_gpu_type,
    "gpus_per_node": check_gpus_per_node,
    "cpus_per_gpu": check_cpus_per_gpu,
    "time_limit": check_time_limit,
    "snakemake": check_snakemake,
}
# Answers that reach shell scripts unquoted (#SBATCH lines, which Slurm never expands).
SHELL_WORDS = (
    "account", "partition", "gpu_type", "nodes", "gpus_per_node", "cpus_per_gpu", "memory",
    "time_limit", "mail", "project_slug",
)  # fmt: skip


def check(field: str, value: object, answers: Mapping[str, Any], presets: Mapping[str, Any]) -> str:
    """Run the rule of one field; the shell-safety rule backs up every shell word."""
    text = str(value)
    if field in CONTEXT_RULES:
        message = CONTEXT_RULES[field](text, answers, presets)
    else:
        message = RULES[field](text) if field in RULES else ""
    if not message and field in SHELL_WORDS:
        if _SHELL_SPECIAL & set(text):
            message = _say(field, text, "must not contain quotes, spaces or shell metacharacters")
        elif not _PRINTABLE_ASCII.fullmatch(text):
            message = _say(field, text, "must be printable ASCII (no invisible characters)")
    return message


def validate(answers: Mapping[str, Any], presets: Mapping[str, Any]) -> list[str]:
    """Check all answers; return one message per rejected field, in question order."""
    return [m for field in answers if (m := check(field, answers[field], answers, presets))]


class Validation(Extension):
    """Copier extension: the ``hpc_check`` and ``slugify`` filters."""

    def __init__(self, environment: Any) -> None:
        """Register the filters on copier's Jinja environment."""
        super().__init__(environment)
        environment.filters["hpc_check"] = _hpc_check
        # cookiecutter ships a slugify filter; copier does not.
        environment.filters.setdefault("slugify", _slugify)


@pass_context
def _hpc_check(context: Any, value: object, field: str) -> str:
    """Copier validator: the rule's message, with the preset data of the hidden question."""
    answers = {k: context.get(k) for k in ("cluster", "partition", "python_version")}
    return check(field, value, answers, context.get("presets") or {})


def _slugify(value: str, separator: str = "_") -> str:
    return to_slug(value).replace("_", separator)


def main(answers: dict[str, Any]) -> int:
    """Cookiecutter/cruft entry: print every rejected answer, exit 1 if there is one."""
    errors = validate(answers, answers.get("_presets", {}))
    for message in errors:
        print(f"ERROR: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(json.loads(r"""{{ cookiecutter | tojson }}""")))
