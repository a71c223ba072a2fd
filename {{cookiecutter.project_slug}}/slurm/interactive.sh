#!/bin/bash
{%- set preset = cookiecutter._presets[cookiecutter.cluster] %}
{%- macro q(value) -%}'{{ value | string | replace("'", "'\"'\"'") }}'{%- endmacro %}
# An interactive shell on a compute node of the interactive partition
# ({{ preset.interactive_partition }}, GPU: {{ preset.interactive_gpu_request }}), for developing and debugging.
# Run it on the login node, from the project root:
#   slurm/interactive.sh [srun options]     e.g. slurm/interactive.sh --time=4:00:00 --mem=32G
# Options given here come after the defaults below and win. Inside: activate the environment
# (see README), then e.g. `make train ARGS="train.epochs=1"` or `python -m {{ cookiecutter.project_slug }} doctor`.
# The job is named "interactive", which also stops tools such as Lightning from mistaking the
# shell for a batch job. Leave with `exit`; the allocation ends with the shell.
set -euo pipefail

options=(
    --job-name=interactive
    --partition={{ q(preset.interactive_partition) }}
{%- if preset.interactive_gpu_request %}
    {{ q(preset.interactive_gpu_request) }}
{%- endif %}
    --nodes=1
    --ntasks=1
    --cpus-per-task={{ q(cookiecutter.cpus_per_gpu | int) }}
    --mem={{ q(cookiecutter.memory.replace("/gpu", "")) }}
    --time=02:00:00
{%- if cookiecutter.account %}
    --account={{ q(cookiecutter.account) }}
{%- endif %}
)
exec srun "${options[@]}" "$@" --pty "${SHELL:-/bin/bash}" -l
