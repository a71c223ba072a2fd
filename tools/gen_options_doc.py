"""Write the options reference of the docs from the template's own sources.

Sources: the questions, defaults, choices and help texts in ``cookiecutter.json``; the
answer rules of ``hooks/pre_gen_project.py``, run on the sample bad answers below so the
page shows the exact message each rule prints; the cluster presets in ``presets/*.toml``,
including their header comments.
Output: ``docs/reference/options.md``. Never edit that page by hand.

    python tools/gen_options_doc.py           # (re)write the page
    python tools/gen_options_doc.py --check   # exit 1 when the page is stale (a test runs it)
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from sync_questions import load_rules

ROOT = Path(__file__).resolve().parent.parent
COOKIECUTTER_JSON = ROOT / "cookiecutter.json"
PRESETS = ROOT / "presets"
OUTPUT = ROOT / "docs" / "reference" / "options.md"


# Sample bad answers, (field, value, other answers), one or more per checked field; the page
# shows what the rules say about them. tests/test_docs.py fails when a checked field has none.
SAMPLES: list[tuple[str, str, dict[str, str]]] = [
    ("project_name", "", {}),
    ("project_slug", "my-model", {}),
    ("project_slug", "class", {}),
    ("project_slug", "json", {}),
    ("project_slug", "torch", {}),
    ("description", "two\nlines", {}),
    ("author_name", "", {}),
    ("author_email", "jane@example", {}),
    ("account", "my account", {}),
    ("partition", "gpu|other", {}),
    ("nodes", "0", {}),
    ("gpus_per_node", "9", {}),
    ("gpus_per_node", "5", {"partition": "grete"}),
    ("gpus_per_node", "9", {"cluster": "generic"}),
    ("gpu_type", "", {"partition": "scc-gpu"}),
    ("gpu_type", "", {"partition": "grete,grete-h100"}),
    ("cpus_per_gpu", "0", {}),
    ("cpus_per_gpu", "100", {}),
    ("memory", "64GB", {}),
    ("memory", "64", {}),
    ("time_limit", "1-24:00:00", {}),
    ("time_limit", "0:30", {}),
    ("time_limit", "3-00:00:00", {}),
    ("time_limit", "8-00:00:00", {"cluster": "generic"}),
    ("mail", "me", {}),
    ("snakemake", "yes", {"python_version": "3.10"}),
]


def checked_fields(rules: Any) -> set[str]:
    """Every field that has a rule of its own or must be a safe shell word."""
    fields = set(rules.RULES) | set(getattr(rules, "CONTEXT_RULES", {}))
    return fields | set(getattr(rules, "SHELL_WORDS", ()))


def sample_messages(rules: Any, cc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(field, value, message) for each sample, run through the real rules."""
    presets = cc["_presets"]
    rows = []
    for field, value, extra in SAMPLES:
        cluster = extra.get("cluster", cc["cluster"][0])
        answers = {"cluster": cluster, "partition": presets[cluster]["batch_partition"]} | extra
        rows.append((field, value, rules.check(field, value, answers, presets)))
    return rows


def _cell(text: str) -> str:
    """Escape a value for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else "*(empty)*"


def _default(raw: Any) -> str:
    """Describe a cookiecutter default: the first choice, a literal or a preset lookup."""
    if isinstance(raw, list):
        return _code(str(raw[0]))
    text = str(raw)
    if "_presets[cookiecutter.cluster]." in text:
        key = text.split("_presets[cookiecutter.cluster].")[1].split(maxsplit=1)[0].rstrip("}")
        return f"preset's `{key}`"
    if "slugify" in text:
        return "derived from `project_name`"
    return _code(text)


def _header_comment(text: str) -> list[str]:
    """The comment lines at the top of a preset file (its sources and how to verify it)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return lines


def questions_section(cc: dict[str, Any], checked: set[str], shell: set[str]) -> str:
    """The table of questions: prompt, default, choices and what is checked."""
    prompts = cc.get("__prompts__", {})
    rows = [
        "| question | prompt | default | choices | checked |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, raw in cc.items():
        if name.startswith("_"):
            continue
        choices = ", ".join(f"`{c}`" for c in raw) if isinstance(raw, list) else ""
        if isinstance(raw, list):
            check = "one of the choices" + (" + rule" if name in checked else "")
        elif name in shell:
            check = "rule + shell-safe"
        elif name in checked:
            check = "rule"
        else:
            check = "free text"
        rows.append(
            f"| `{name}` | {_cell(prompts.get(name, ''))} | {_default(raw)} | {choices} | {check} |"
        )
    return "\n".join(rows)


def samples_section(rows: list[tuple[str, str, str]]) -> str:
    """The table of sample bad answers and the message each one gets."""
    out = ["| question | answer | message |", "| --- | --- | --- |"]
    for field, value, message in rows:
        out.append(f"| `{field}` | `{_cell(repr(value))}` | {_cell(message) or 'accepted'} |")
    return "\n".join(out)


def preset_section(name: str, text: str, default_cluster: str) -> str:
    """One preset: its header comment, its keys and its partitions."""
    preset = tomllib.loads(text)
    title = f"### `{name}`" + (" (default)" if name == default_cluster else "")
    out = [title, "", preset.get("description", ""), ""]
    comment = _header_comment(text)
    if comment:
        out += ["```text", *comment, "```", ""]
    fields = [
        ("login_host", "login node (`ssh` target)"),
        ("batch_partition", "default partition of training jobs"),
        ("interactive_partition", "partition of `slurm/interactive.sh`"),
        ("gpu_type_required", "every partition needs a known GPU type (or a `gpu_type` answer)"),
        ("gpu_request", "how a job asks for GPUs (`{type}`, `{count}` filled in)"),
        ("interactive_gpu_request", "GPU request of interactive jobs"),
        ("modules", "modules loaded before Python runs"),
        ("container_module", "module that provides `apptainer`"),
        ("node_tmp_var", "variable naming the node-local tmp folder of a job"),
        ("default_time", "default `time_limit`"),
        ("default_memory", "default `memory`"),
        ("default_cpus_per_gpu", "default `cpus_per_gpu`"),
        ("internet_constraint", "Slurm constraint (`-C`) that gives a job internet access"),
        ("torch_variant", "CUDA build of torch `make install` takes from PyTorch's wheel index"),
        ("home_quota_gb", "`$HOME` quota in GB (0: unknown), for `plan`'s storage advice"),
    ]
    out += ["| key | value | meaning |", "| --- | --- | --- |"]
    # Keys this page has no words for yet still appear, so a new preset key is never hidden.
    known = {key for key, _ in fields} | {"description", "partitions"}
    fields += [(key, "") for key in preset if key not in known]
    for key, meaning in fields:
        value = preset.get(key, "")
        if isinstance(value, list):
            shown = ", ".join(f"`{v}`" for v in value) or "*(none)*"
        else:
            shown = _code(str(value))
        out.append(f"| `{key}` | {_cell(shown)} | {meaning} |")
    columns = ("partition", "max time", "GPU type", "GPUs per node", "cores per node",
               "GPU memory", "node memory")  # fmt: skip
    out += ["", f"| {' | '.join(columns)} |", "|" + " --- |" * len(columns)]
    for part, limits in preset.get("partitions", {}).items():
        node_memory = limits.get("node_memory") or "unknown (no ceiling)"
        out.append(
            f"| `{part}` | `{limits['max_time']}` | {_code(str(limits['gpu_type']))} | "
            f"{limits['gpus_per_node']} | {limits['cpus_per_node']} | {limits['gpu_memory']} "
            f"| {node_memory} |"
        )
    return "\n".join(out)


def render() -> str:
    """The whole page."""
    cc = json.loads(COOKIECUTTER_JSON.read_text("utf-8"))
    rules = load_rules()
    clusters = cc.get("cluster", [])
    default_cluster = clusters[0] if clusters else ""
    presets = "\n\n".join(
        preset_section(p.stem, p.read_text("utf-8"), default_cluster)
        for p in sorted(PRESETS.glob("*.toml"), key=lambda p: (p.stem != default_cluster, p.stem))
    )
    shell = set(getattr(rules, "SHELL_WORDS", ()))
    return f"""<!-- GENERATED by tools/gen_options_doc.py from cookiecutter.json,
hooks/pre_gen_project.py and presets/*.toml. Do not edit: change the sources and run
`python tools/gen_options_doc.py`. -->
# Options reference

Every question the template asks, in the order it asks them. All three engines ask the same
questions with the same defaults (`copier.yml` is generated from `cookiecutter.json`). Give
answers on the command line to skip the prompts, e.g.
`cookiecutter --no-input <template> cluster=generic gpus_per_node=4`
or `copier copy --trust --data cluster=generic <template> my_project`.

A rejected answer stops the engine before anything is written, with one line naming the
field, the value and the rule; asked interactively, every engine asks again instead. The
rules hold for answers from any route: the command line, a cookiecutter config or rc file,
a replay file, copier's `--data-file` or an edited answers file. Limits that depend on the
cluster (GPUs per node, maximum time) come from the partition you chose, as declared in
its preset; a partition the preset does not declare is checked for its syntax only.

## Questions

{questions_section(cc, checked_fields(rules), shell)}

*rule*: the answer rules in `hooks/pre_gen_project.py` check the value; *shell-safe*: the
value ends up unquoted in `#SBATCH` lines, so quotes, spaces and shell metacharacters are
refused as well; *free text*: any single line (quotes and unicode are fine: the template
escapes it where it is written).

## What a rejected answer looks like

Each line below was produced by running the rules on the answer shown (with the default
preset unless the message names another); this is what the engines print.

{samples_section(sample_messages(rules, cc))}

## Cluster presets

A preset is one TOML file in `presets/`; its values fill the defaults above and the job
scripts. The values are defaults to check on your cluster (see the
[HPC guide](../hpc-guide.md#verify-the-preset-on-your-cluster)), not promises.
To add a cluster, see [Add a cluster preset](../howto/cluster-preset.md).

{presets}
"""


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with --check report whether it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args(argv)
    wanted = render()
    current = OUTPUT.read_text("utf-8") if OUTPUT.exists() else None
    if args.check:
        if current != wanted:
            print(
                f"stale: {OUTPUT.relative_to(ROOT)} (run `python tools/gen_options_doc.py`)",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != wanted:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(wanted, "utf-8")
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
