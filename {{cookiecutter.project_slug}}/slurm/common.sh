# shellcheck shell=bash
{%- set preset = cookiecutter._presets[cookiecutter.cluster] %}
{%- set slug = cookiecutter.project_slug %}
{%- macro q(value) -%}'{{ value | string | replace("'", "'\"'\"'") }}'{%- endmacro %}
# Shared part of slurm/train.sbatch and slurm/sweep.sbatch, sourced by them (not run):
# software environment, launch, stop signals and requeue. Change a rule here once for both.
#
# Knobs (environment variables, e.g. `sbatch --export=ALL,MAX_REQUEUES=5 slurm/train.sbatch`):
#   LAUNCHER=srun|torchrun  how ranks start (default srun: one Slurm task per GPU; see below)
#   MAX_REQUEUES=20         requeues allowed per job (retry budget, counted by Slurm)
#   AUTO_REQUEUE=1          0: exit after the checkpoint instead of requeueing (chain.sh sets it)
{%- if cookiecutter.environment in ('venv', 'uv') %}
#   VENV_DIR=.venv          the virtual environment (made by `make install`)
{%- elif cookiecutter.environment == 'conda' %}
#   CONDA_ENV_DIR=.conda    the conda prefix environment (made by `make install`)
{%- else %}
#   CONTAINER_IMAGE=container/{{ slug }}.sif   the Apptainer image (made by `make container`)
{%- endif %}

# Exit code of `{{ slug }} train` meaning "checkpoint written after a stop signal, please
# requeue" (EXIT_REQUEUE in src/{{ slug }}/preemption.py; a template test keeps them equal).
readonly EXIT_REQUEUE=3
readonly PACKAGE={{ q(slug) }}
readonly NODE_TMP_VAR={{ q(preset.node_tmp_var) }}

log() { printf '[%s] %s\n' "$(date '+%F %T')" "$*"; }
die() { log "error: $*" >&2; exit 2; }

# Modules of the cluster preset; skipped where there is no module system (e.g. a laptop).
load_modules() {
    (($# > 0)) || return 0
    if ! command -v module >/dev/null 2>&1; then
        log "no 'module' command here; not loading: $*"
        return 0
    fi
    set +u  # some sites' module scripts read unset variables
    module load "$@"
    set -u
}

# The value of NAME from the environment, else from .env (as the Python side reads it).
env_or_dotenv() {
    local name=$1 line value=${!1:-}
    if [[ -z "$value" && -f .env ]]; then
        line=$(grep -E "^[[:space:]]*(export[[:space:]]+)?$name=" .env | tail -n 1 || true)
        value=${line#*=}
        value=${value%\"}; value=${value#\"}; value=${value%\'}; value=${value#\'}
    fi
    printf '%s' "$value"
}

# Caches of the compiler and of model downloads, placed on purpose (the reasons are in
# .env.example): a value from the environment or .env wins over these defaults.
set_caches() {
    local tmp=${!NODE_TMP_VAR:-${TMPDIR:-/tmp}} name value
    local -A defaults=(
        [TORCHINDUCTOR_CACHE_DIR]="$tmp/torchinductor"  # many small files: node-local disk
        [TRITON_CACHE_DIR]="$tmp/triton"                # likewise; default ~/.triton fills $HOME
        [HF_HOME]="$PWD/.cache/huggingface"             # large downloads: project, not $HOME
        [TORCH_HOME]="$PWD/.cache/torch"
    )
    for name in "${!defaults[@]}"; do
        value=$(env_or_dotenv "$name")
        export "$name=${value:-${defaults[$name]}}"
    done
}
{%- if cookiecutter.environment in ('venv', 'uv') %}

# Sets PYTHON (the command that runs Python) for the launch below.
{%- if cookiecutter.environment == 'uv' %}
# The project's .venv as `make install` (uv sync) left it: not `uv run`, which would sync it
# first, on a node that may have no internet and from every rank at once.
{%- endif %}
activate_environment() {
    load_modules{% for m in preset.modules %} {{ q(m) }}{% endfor %}
    local venv="${VENV_DIR:-.venv}"
    [[ -f "$venv/bin/activate" ]] || die "no virtual environment in $venv: run 'make install' first"
    set +u
    # shellcheck source=/dev/null
    source "$venv/bin/activate"
    set -u
    PYTHON=(python)
}
{%- elif cookiecutter.environment == 'conda' %}

# Sets PYTHON (the command that runs Python) for the launch below.
activate_environment() {
    load_modules{% for m in preset.modules %} {{ q(m) }}{% endfor %}
    local prefix="${CONDA_ENV_DIR:-.conda}"
    [[ -d "$prefix/conda-meta" ]] || die "no conda environment in $prefix: run 'make install' first"
    command -v conda >/dev/null 2>&1 || die "conda not found (load its module)"
    set +u
    eval "$(conda shell.bash hook)"
    # A relative prefix is inside the project; CONDA_ENV_DIR may also be absolute (project storage).
    [[ "$prefix" == /* ]] || prefix="$PWD/$prefix"
    conda activate "$prefix"
    set -u
    PYTHON=(python)
}
{%- else %}

# An absolute path: relative ones are taken from the project root, as the Python side does.
absolute() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s' "$PWD/$1" ;; esac; }

# Sets PYTHON (the command that runs Python) for the launch below: Python inside the image,
# with the project mounted at the same path, data/raw read-only and node-local tmp mounted.
# src/ of this working tree comes first on PYTHONPATH, so the code you commit is the code
# that runs; the image supplies the libraries.
activate_environment() {
    command -v apptainer >/dev/null 2>&1 || load_modules{% if preset.container_module %} {{ q(preset.container_module) }}{% endif %}
    command -v apptainer >/dev/null 2>&1 || die "apptainer not found{% if preset.container_module %} (module load {{ preset.container_module }}){% endif %}"
    local image="${CONTAINER_IMAGE:-container/{{ slug }}.sif}"
    [[ -f "$image" ]] || die "no image $image: build it with 'make container'"
    local data runs tmp
    data=$(env_or_dotenv DATA_DIR)
    data=$(absolute "${data:-data}")
    runs=$(env_or_dotenv RUNS_DIR)
    runs=$(absolute "${runs:-runs}")
    local binds=(--bind "$PWD")
    [[ "$data" == "$PWD"/* || ! -d "$data" ]] || binds+=(--bind "$data")
    [[ "$runs" == "$PWD"/* || ! -d "$runs" ]] || binds+=(--bind "$runs")
    # Raw data is immutable: mounted read-only over the writable mounts above.
    [[ ! -d "$data/raw" ]] || binds+=(--bind "$data/raw:$data/raw:ro")
    tmp=${!NODE_TMP_VAR:-}
    [[ -z "$tmp" || ! -d "$tmp" ]] || binds+=(--bind "$tmp")
    PYTHON=(apptainer exec --nv "${binds[@]}" --pwd "$PWD" --env "PYTHONPATH=$PWD/src"
        "$image" python)
}
{%- endif %}
{% raw %}
# --------------------------------------------------------------------------- stop signals
# Slurm sends USR1 to this shell (`--signal=B:USR1@...`) before the time limit, or on
# `scancel --signal=USR1 --batch JOB`. The trap forwards it to the job step; srun passes it
# on to every rank. The training checkpoints at its next step boundary and exits with
# EXIT_REQUEUE. TERM (scancel, preemption, the hard limit) reaches the ranks directly from
# Slurm; this shell only notes it, keeps waiting for the checkpoint and does not requeue:
# a cancelled job stays cancelled.
STOP_SIGNAL=""
SIGNALS_SEEN=0
STEP_PID=""
on_signal() {
    STOP_SIGNAL=$1
    SIGNALS_SEEN=$((SIGNALS_SEEN + 1))
    log "received SIG$1"
    if [[ "$1" == USR1 && -n "$STEP_PID" ]]; then
        kill -s USR1 "$STEP_PID" 2>/dev/null || true
    fi
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM

# Requeue this job (an array task by its own id), within the retry budget.
requeue() {
    local ref=$SLURM_JOB_ID restarts=${SLURM_RESTART_COUNT:-0} budget=${MAX_REQUEUES:-20}
    if [[ -n "${SLURM_ARRAY_JOB_ID:-}" ]]; then
        ref="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    fi
    if ((restarts >= budget)); then
        log "not requeueing $ref: $restarts requeues already (MAX_REQUEUES=$budget);" \
            "resubmit to continue from the checkpoint"
        return 1
    fi
    log "requeueing $ref (requeue $((restarts + 1)) of at most $budget)"
    scontrol requeue "$ref"
}

# ----------------------------------------------------------------------------- the launch
# Default LAUNCHER=srun: one Slurm task per GPU (`--ntasks-per-node` = GPUs per node); each
# rank reads its place from SLURM_PROCID/SLURM_LOCALID/SLURM_STEP_NUM_TASKS and the first node
# of the allocation as the rendezvous host. Chosen because
#   - Slurm starts, signals and accounts for every rank itself: the trap's USR1 reaches all
#     ranks through srun, and every rank's exit code comes back through srun, so the script
#     sees EXIT_REQUEUE exactly;
#   - one command for one GPU, several GPUs and several nodes; no extra agent process and no
#     rendezvous server;
#   - it needs nothing but Python inside a container.
# LAUNCHER=torchrun: one torchrun agent per node (c10d rendezvous on the first node) starts
# the ranks. Use it for code that expects torchrun (elastic agents, LOCAL_RANK from torchrun).
# The agent forwards USR1 to the ranks (PET_SIGNALS_TO_HANDLE, torch >= 2.7) but reports its
# own exit code, so there a requeue follows a forwarded USR1 instead of EXIT_REQUEUE.
# srun runs without --kill-on-bad-exit: EXIT_REQUEUE is a non-zero exit of every rank, and
# rank 0 may still be writing its summary when the others end. A crashed rank makes the
# others fail at their next collective call (train: dist.timeout_minutes at the latest).
launch_command() {
    local launcher=${LAUNCHER:-srun}
    case $launcher in
        srun)
            STEP=(srun "${PYTHON[@]}" -m "$PACKAGE" "$@")
            ;;
        torchrun)
            local head port per_node=${SLURM_NTASKS_PER_NODE:-1}
            head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
            # Differs from the port the srun launcher would use for this job (20000 + id).
            port=$((20000 + (SLURM_JOB_ID + 10000) % 20000))
            export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
            STEP=(srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES"
                --cpus-per-task="$((${SLURM_CPUS_PER_TASK:-1} * per_node))"
                "${PYTHON[@]}" -m torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES"
                --nproc-per-node="$per_node" --rdzv-backend=c10d
                --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID"
                -m "$PACKAGE" "$@")
            ;;
        *) die "LAUNCHER must be srun or torchrun, not '$launcher'" ;;
    esac
}

# Run `python -m PACKAGE "$@"` on every rank of the allocation and act on the outcome:
# exit code 0 finishes the job; EXIT_REQUEUE after USR1 requeues it (within the budget).
run_training() {
    local rc seen
    log "job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_JOB_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})}" \
        "on ${SLURM_JOB_NODELIST:-$(hostname)}, restart ${SLURM_RESTART_COUNT:-0}," \
        "commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
    # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch allocation.
    if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
    fi
    export PYTHONUNBUFFERED=1
    set_caches
    activate_environment
    launch_command "$@"
    if [[ -n "$STOP_SIGNAL" ]]; then  # the signal came during set-up: nothing to save yet
        if [[ "$STOP_SIGNAL" == USR1 && "${AUTO_REQUEUE:-1}" != 0 ]] && requeue; then
            exit 0
        fi
        exit 1
    fi
    log "launch: ${STEP[*]}"
    "${STEP[@]}" &
    STEP_PID=$!
    while true; do
        seen=$SIGNALS_SEEN
        rc=0
        wait "$STEP_PID" || rc=$?
        # A trapped signal interrupts `wait` (status > 128); the next `wait` returns the step's
        # own status, at once if it has ended meanwhile.
        ((SIGNALS_SEEN != seen && rc > 128)) || break
    done
    log "training step ended with exit code $rc"

    local wants_requeue=0
    if [[ "${LAUNCHER:-srun}" == torchrun ]]; then
        [[ "$STOP_SIGNAL" == USR1 && $rc -ne 0 ]] && wants_requeue=1
    elif ((rc == EXIT_REQUEUE)); then
        wants_requeue=1
    fi
    if ((wants_requeue)); then
        if [[ "$STOP_SIGNAL" == TERM ]]; then
            log "stopped by SIGTERM (cancel, preemption or hard limit): checkpoint kept, no requeue"
            exit "$rc"
        fi
        if [[ "${AUTO_REQUEUE:-1}" == 0 ]]; then
            log "checkpoint written; AUTO_REQUEUE=0, so the next job of the chain continues"
            exit 0
        fi
        if requeue; then
            exit 0
        fi
    fi
    exit "$rc"
}
{% endraw -%}
