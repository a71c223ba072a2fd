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
#   MIN_WORK_SECONDS=120    a job whose limit leaves less training time before the stop
#                           signal ends at once with an error instead of requeueing itself
#   STOP_GRACE=SECONDS      how long before the limit the stop signal comes (default: a tenth
#                           of the limit, 60-300 s, or more when an earlier stop of the run
#                           took long; see stop_grace below)
#   RETRIES=2               relaunches from the last checkpoint after a transient failure
#                           (exit 75, or a rank aborted) before the job fails; torchrun's
#                           --max-restarts
# STOP_GRACE and RETRIES may also be set in .env.
{%- if cookiecutter.environment in ('venv', 'uv') %}
#   VENV_DIR=.venv          the virtual environment (made by `make install`)
{%- elif cookiecutter.environment == 'conda' %}
#   CONDA_ENV_DIR=.conda    the conda prefix environment (made by `make install`)
{%- else %}
#   CONTAINER_IMAGE=container/{{ slug }}.sif   the Apptainer image (made by `make container`)
{%- endif %}

# Exit code of `{{ slug }} train` meaning "checkpoint written after a stop signal, please
# requeue" (EXIT_REQUEUE in src/{{ slug }}/engine/parallel/preemption.py; a template test keeps them equal).
readonly EXIT_REQUEUE=3
# Exit codes of a transient failure, worth a relaunch from the last checkpoint: 75 is what
# `{{ slug }} train` exits with after a distributed (NCCL, store) error (EXIT_TRANSIENT in
# src/{{ slug }}/observe/diagnostics.py; a template test keeps them equal), 134 is srun's code for a
# rank ended by SIGABRT, which is how NCCL's watchdog ends a rank stuck in a collective.
readonly TRANSIENT_EXITS=" 75 134 "
# Every other code ends the job with it, no relaunch: 4 (the loss diverged), 5 (no intact
# checkpoint), 6 (the data failed to read: a damaged file, to repair before the next start).
readonly PACKAGE={{ q(slug) }}
# The variable naming the node-local disk where the data is staged (data.node_tmp_var).
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
    # A clean state: modules loaded at login (e.g. cuda) must not leak into the job, where
    # their libraries on LD_LIBRARY_PATH can shadow the CUDA libraries of the torch wheel.
    module purge
    module load "$@"
    set -u
    log "modules: $*"
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

# Caches of the compiler, placed on purpose (the reasons are in .env.example): a value from
# the environment or .env wins over these defaults.
set_caches() {
    local tmp=${!NODE_TMP_VAR:-${TMPDIR:-/tmp}} name value
    local -A defaults=(
        [TORCHINDUCTOR_CACHE_DIR]="$tmp/torchinductor"  # many small files: node-local disk
        [TRITON_CACHE_DIR]="$tmp/triton"                # likewise; default ~/.triton fills $HOME
    )
    # HF_HOME, HF_DATASETS_CACHE and TORCH_HOME (large downloads) are placed by the package
    # itself (settings.py: below DATA_DIR unless .env says otherwise), the same in a job as on
    # the login node that downloaded them.
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
# USR1 reaches this shell from the timer below (a grace time before the job's limit), from
# `scancel --signal=USR1 --batch JOB`, or from a `--signal=B:USR1@...` given to sbatch. The
# trap forwards it to the job step; srun passes it on to every rank. The training
# checkpoints at its next step boundary and exits with EXIT_REQUEUE. Preemption (e.g. on
# grete:preemptible) sends SIGTERM to the ranks only, a grace time before they are killed:
# they checkpoint the same way, and this shell, which saw no signal itself, requeues the
# job like after USR1 (measured on Slurm 22.05 with PreemptMode=REQUEUE: a job script that
# ends within the grace time ends COMPLETED, not requeued, unless it requeues itself).
# scancel and the hard time limit send TERM to this shell as well: it notes it and does not
# requeue, so a cancelled job stays cancelled.
STOP_SIGNAL=""
FIRST_SIGNAL=""
STOP_AT=""
GRACE=""
SIGNALS_SEEN=0
STEP_PID=""
TIMER_PID=""
JOB_STARTED=$SECONDS
on_signal() {
    STOP_SIGNAL=$1
    if [[ -z "$FIRST_SIGNAL" ]]; then
        FIRST_SIGNAL=$1
        STOP_AT=$SECONDS
        # Until the stop ends it counts as needing the whole grace: a stop whose checkpoint is
        # killed at the limit (no report_stop then) still raises the next segment's grace.
        if [[ "$1" == USR1 && -n "$GRACE" && -d logs ]]; then
            echo "$GRACE" >"$(stop_record)" 2>/dev/null || true
        fi
    fi
    SIGNALS_SEEN=$((SIGNALS_SEEN + 1))
    log "received SIG$1"
    if [[ "$1" == USR1 && -n "$STEP_PID" ]]; then
        kill -s USR1 "$STEP_PID" 2>/dev/null || true
    fi
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM
trap 'on_exit' EXIT

# Seconds of a Slurm duration as squeue prints it: [D-]H:M:S, M:S or M; fails on
# UNLIMITED, NOT_SET and other words.
seconds_of() {
    local text=$1 days=0 h=0 m=0 s=0 parts
    [[ "$text" =~ ^([0-9]+-)?[0-9]+(:[0-9]+){0,2}$ ]] || return 1
    if [[ "$text" == *-* ]]; then
        days=${text%%-*}
        text=${text#*-}
    fi
    IFS=: read -r -a parts <<<"$text"
    case ${#parts[@]} in
        3) h=${parts[0]} m=${parts[1]} s=${parts[2]} ;;
        2) if ((days > 0)); then h=${parts[0]} m=${parts[1]}; else m=${parts[0]} s=${parts[1]}; fi ;;
        1) if ((days > 0)); then h=${parts[0]}; else m=${parts[0]}; fi ;;
    esac
    echo $(((((10#$days * 24) + 10#$h) * 60 + 10#$m) * 60 + 10#$s))
}

# The job's limit and time left in seconds ("LIMIT LEFT"); fails when Slurm names no limit.
# squeue first, asked twice (a busy controller may not answer at once), then `scontrol show
# job` (TimeLimit minus RunTime), then SLURM_JOB_START_TIME/SLURM_JOB_END_TIME (set in the
# job by newer Slurm releases, no controller needed): one failing squeue call never leaves a
# job without its stop signal. An answer of UNLIMITED is final.
job_times() {
    local times limit left run info start end now attempt
    for attempt in 1 2; do
        read -r -a times <<<"$(squeue -h -j "$SLURM_JOB_ID" -o '%l %L' 2>/dev/null)"
        [[ "${times[0]:-}" != UNLIMITED ]] || return 1
        if limit=$(seconds_of "${times[0]:-}") && left=$(seconds_of "${times[1]:-}"); then
            echo "$limit $left"
            return 0
        fi
        ((attempt == 2)) || sleep 2
    done
    info=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null || true)
    if [[ "$info" =~ TimeLimit=([^[:space:]]+) ]] && limit=$(seconds_of "${BASH_REMATCH[1]}") \
        && [[ "$info" =~ RunTime=([^[:space:]]+) ]] && run=$(seconds_of "${BASH_REMATCH[1]}"); then
        log "squeue gave no time limit; scontrol did" >&2
        echo "$limit $((limit > run ? limit - run : 0))"
        return 0
    fi
    start=${SLURM_JOB_START_TIME:-} end=${SLURM_JOB_END_TIME:-}
    if [[ "$start" =~ ^[0-9]+$ && "$end" =~ ^[0-9]+$ ]] && ((end > start)); then
        now=$(date +%s)
        log "squeue and scontrol gave no time limit; SLURM_JOB_END_TIME did" >&2
        echo "$((end - start)) $((end > now ? end - now : 0))"
        return 0
    fi
    return 1
}

# Where the stop of a run records how long it took (signal to exit), for the grace of the
# run's next segment: logs/.stop-seconds-<run name, else job id>. Written when USR1 arrives
# (the whole grace, as a stop killed at the limit never reports) and again when it ends.
stop_record() {
    local key=${RUN_KEY:-${SLURM_JOB_ID:-}}
    printf 'logs/.stop-seconds-%s' "${key//\//_}"
}

# Sets GRACE, the seconds between the stop signal and the limit, and GRACE_WHY. The stop must
# end within it: the next step boundary, a validation in progress, the checkpoint. When the
# limit's SIGTERM comes first, the save may be cut off by the kill that follows it.
# STOP_GRACE (environment or .env) wins. Else a tenth of the limit, at least 60 s (the
# checkpoint, and the margin Slurm's own timing needs) and at most 300 s; raised to twice what
# the last stop of this run took plus 30 s when that is more, so a checkpoint that grew (a
# bigger model, a slower file system) still ends before the limit on the next segment.
stop_grace() {
    local limit=$1 given took
    given=$(env_or_dotenv STOP_GRACE)
    if [[ -n "$given" ]]; then
        [[ "$given" =~ ^[1-9][0-9]*$ ]] || die "STOP_GRACE=$given: give whole seconds, e.g. 600"
        GRACE=$((10#$given))
        GRACE_WHY="STOP_GRACE"
        return 0
    fi
    GRACE=$((limit / 10))
    ((GRACE >= 60)) || GRACE=60
    ((GRACE <= 300)) || GRACE=300
    GRACE_WHY="a tenth of the limit, 60-300 s"
    took=$(cat "$(stop_record)" 2>/dev/null || true)
    if [[ "$took" =~ ^[0-9]+$ ]] && ((2 * took + 30 > GRACE)); then
        GRACE=$((2 * took + 30))
        GRACE_WHY="twice the ${took} s the last stop of this run took, plus 30 s"
    fi
}

# Send this shell USR1 a grace time before the job's actual limit. Read at the start of every
# segment from Slurm (the limit and the time left), not fixed when the script was written: so
# a `--time` given to sbatch, a requeued segment and a job that waited in the queue all get
# the right moment. A limit that leaves less than MIN_WORK_SECONDS of training before the
# signal would checkpoint almost nothing and requeue over and over (GWDG asks for jobs of an
# hour or more): such a job stops here, with an error. That decision looks at the limit, not
# at the time left, so the seconds a segment has already spent starting never turn an
# accepted limit into a refused one on a later segment.
# A limit changed with `scontrol update` after the start is not followed; the hard limit
# still sends TERM, on which the training checkpoints too.
schedule_stop() {
    local limit left work minimum=${MIN_WORK_SECONDS:-120}
    [[ -n "${SLURM_JOB_ID:-}" ]] || return 0
    if ! read -r limit left < <(job_times); then
        log "no time limit found for job $SLURM_JOB_ID: no stop signal scheduled"
        return 0
    fi
    stop_grace "$limit"
    if ((limit - GRACE < minimum)); then
        log "error: the time limit of ${limit} s leaves $((limit - GRACE)) s of training before" \
            "the stop signal ${GRACE} s ahead of it, less than MIN_WORK_SECONDS=${minimum}." \
            "Ask for a longer --time (at least $(((minimum + GRACE + 59) / 60)) minutes; jobs of an hour" \
            "or more are kinder to the scheduler). Not starting and not requeueing."
        exit 2
    fi
    work=$((left > GRACE ? left - GRACE : 0))
    # The training compares its saves with the grace and warns when one would not fit.
    export STOP_GRACE_S=$GRACE
    if ((limit < 3600)); then
        log "note: a limit under one hour makes many short jobs; GWDG asks for at least 1 h"
    fi
    log "time left ${left} s: USR1 to stop in ${work} s, ${GRACE} s before the limit ($GRACE_WHY)"
    # The timer's sleep ends with it (on_exit stops the timer when the job ends first).
    (
        trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
        sleep "$work" &
        sleeper=$!
        wait "$sleeper" && kill -s USR1 $$
    ) &
    TIMER_PID=$!
}

# After a stop: how long it took from the first signal to the training's exit, against the
# grace; recorded for the grace of the run's next segment when the checkpoint was written.
report_stop() {
    local rc=$1 took
    [[ -n "$STOP_AT" ]] || return 0
    took=$((SECONDS - STOP_AT))
    log "the stop took ${took} s from SIG$FIRST_SIGNAL to the training's exit${GRACE:+ (grace ${GRACE} s)}"
    if [[ -n "$GRACE" ]] && ((2 * took > GRACE)); then
        log "warning: the stop took ${took} s, more than half the ${GRACE} s grace before the" \
            "limit; a slower checkpoint would be cut off. The next segment of this run waits" \
            "$((2 * took + 30)) s; set STOP_GRACE=$((2 * took + 30)) (or more) to fix it for every job."
    fi
    if ((rc == EXIT_REQUEUE)) && [[ -d logs ]]; then
        echo "$took" >"$(stop_record)" 2>/dev/null || true
    fi
}

# Whether the SIGTERM this job got is its time limit's: Slurm then gives the ending job the
# reason TimeLimit; after scancel the reason stays None (both COMPLETING; Slurm 22.05, checked).
# `scontrol requeue` from the TERM trap works in that state: the job runs again.
at_time_limit() {
    scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q 'Reason=TimeLimit'
}

# One rank per GPU: a job given more GPUs on a node than tasks there would train on the first
# GPU of each rank and leave the others idle, billed all the same. Fewer GPUs than ranks is
# refused by the trainer's device check.
check_gpus_per_rank() {
    local gpus tasks=${SLURM_NTASKS_PER_NODE:-}
    tasks=${tasks%%(*}  # "4(x2)" on some releases
    [[ -n "${CUDA_VISIBLE_DEVICES:-}" && "$tasks" =~ ^[0-9]+$ ]] || return 0
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    if ((gpus > tasks)); then
        die "this job has $gpus GPUs per node but $tasks task(s) per node, so $((gpus - tasks))" \
            "GPU(s) would idle: ask for one task per GPU, e.g. sbatch --ntasks-per-node=$gpus" \
            "(and --mem for $gpus GPUs) with the same GPU request"
    fi
}

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

# ---------------------------------------------------------------------- after the job
# What this segment cost, at the end of every job (also after an error): elapsed time and
# GPU hours of this segment, then Slurm's accounting of every segment of the job (a
# requeued job keeps its id; `sacct --duplicates` lists each start) and `seff` where the
# site has them. The trainer's time report (data wait, compute, checkpoint) is just above
# in the log. `slurm/monitor.sh efficiency JOBID` prints the same after the job.
efficiency_report() {
    local elapsed=$((SECONDS - JOB_STARTED)) gpus=0 nodes=${SLURM_JOB_NUM_NODES:-1}
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    fi
    log "efficiency: segment ${SLURM_RESTART_COUNT:-0} of job ${SLURM_JOB_ID:-?}:" \
        "elapsed $((elapsed / 3600))h$(((elapsed % 3600) / 60))m$((elapsed % 60))s," \
        "$((gpus * nodes)) GPU(s), $(awk -v s="$elapsed" -v g="$((gpus * nodes))" \
            'BEGIN { printf "%.2f", s * g / 3600 }') GPU hours"
    accounting "${SLURM_JOB_ID:-}"
}

# Slurm's accounting of a job and all its requeued segments, when the site records it.
accounting() {
    local job=$1 records
    [[ -n "$job" ]] || return 0
    if command -v sacct >/dev/null 2>&1 \
        && records=$(sacct -j "$job" --duplicates --allocations --parsable2 --noheader \
            -o JobID,State,Start,Elapsed,AllocTRES,TotalCPU 2>/dev/null) && [[ -n "$records" ]]; then
        log "efficiency: sacct, one line per segment (JobID|State|Start|Elapsed|AllocTRES|TotalCPU):"
        printf '%s\n' "$records"
    else
        log "efficiency: no accounting records (sacct missing or accounting off)"
    fi
    if command -v seff >/dev/null 2>&1; then
        seff "$job" 2>/dev/null | sed -n '/Efficiency\|Wall-clock\|Memory Utilized/p' || true
    fi
}

on_exit() {
    local rc=$?
    [[ -z "$TIMER_PID" ]] || kill "$TIMER_PID" 2>/dev/null || true
    efficiency_report || true
    exit "$rc"
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
# Fail fast: `srun --wait=30` ends the remaining tasks 30 s after the first one has ended.
# A crashed rank leaves its peers blocked in a collective call until the distributed
# timeout (many minutes, on every node); this ends the job within a minute instead. Not
# --kill-on-bad-exit: every rank exits with EXIT_REQUEUE after a checkpoint, and tasks
# killed a moment after the first one ended would report a signal instead of that code.
# The ranks leave together (the trainer waits for rank 0's report before exiting), so the
# 30 s never cut a healthy run short.
launch_command() {
    local launcher=${LAUNCHER:-srun}
    case $launcher in
        srun)
            STEP=(srun --wait=30 "${PYTHON[@]}" -m "$PACKAGE" "$@")
            ;;
        torchrun)
            local head port per_node=${SLURM_NTASKS_PER_NODE:-1}
            head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
            port=$(rendezvous_port torchrun)
            export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
            STEP=(srun --wait=30 --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES"
                --cpus-per-task="$((${SLURM_CPUS_PER_TASK:-1} * per_node))"
                "${PYTHON[@]}" -m torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES"
                --nproc-per-node="$per_node" --max-restarts="$RETRIES" --rdzv-backend=c10d
                --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID"
                -m "$PACKAGE" "$@")
            ;;
        *) die "LAUNCHER must be srun or torchrun, not '$launcher'" ;;
    esac
}

# The rendezvous port of this job: the rule of rendezvous_port() in
# src/<package>/engine/parallel/distributed.py (a template test keeps the two equal). Ports 10000-29999,
# below Linux's ephemeral range: 10 per job id, taken from the id modulo 2000, so jobs whose
# ids differ by less than 2000 never share one (array tasks have ids of their own, which
# are consecutive); 0-4 for the srun launcher by restart count, 5 for torchrun's agent.
rendezvous_port() {
    local offset=$(( ${SLURM_RESTART_COUNT:-0} % 5 ))
    [[ "$1" != torchrun ]] || offset=5
    echo $((10000 + (SLURM_JOB_ID % 2000) * 10 + offset))
}

# Where the data is staged: node-local disk when the site names one, else (logged) none.
log_node_storage() {
    local dir=${!NODE_TMP_VAR:-}
    if [[ -n "$dir" && -d "$dir" ]]; then
        log "node-local storage: $NODE_TMP_VAR=$dir (data is staged there)"
    else
        log "warning: $NODE_TMP_VAR is unset or not a directory on $(hostname):" \
            "no staging, the data is read from the shared file system"
    fi
}

# The run's name as the job knows it (RUN_NAME, a run.name=... argument), else the job id.
run_key() {
    local key=${RUN_NAME:-} arg
    for arg; do
        [[ "$arg" != run.name=* ]] || key=${arg#run.name=}
    done
    printf '%s' "${key:-${SLURM_JOB_ID:-}}"
}

# Sets RETRIES from the environment or .env (default 2), checked.
read_retries() {
    RETRIES=$(env_or_dotenv RETRIES)
    RETRIES=${RETRIES:-2}
    [[ "$RETRIES" =~ ^[0-9]+$ ]] || die "RETRIES=$RETRIES: give a whole number, e.g. 2"
}

# Start the step in the background and wait for it; a trapped signal interrupts `wait`
# (status > 128), the next `wait` returns the step's own status. Sets rc.
run_step() {
    local seen
    log "launch: ${STEP[*]}"
    "${STEP[@]}" &
    STEP_PID=$!
    while true; do
        seen=$SIGNALS_SEEN
        rc=0
        wait "$STEP_PID" || rc=$?
        ((SIGNALS_SEEN != seen && rc > 128)) || break
    done
    STEP_PID=""
    log "training step ended with exit code $rc"
}

# Run `python -m PACKAGE "$@"` on every rank of the allocation and act on the outcome:
# exit code 0 finishes the job; EXIT_REQUEUE after USR1 requeues it (within the budget); a
# transient failure relaunches the step (RETRIES times), which resumes from the last checkpoint.
run_training() {
    local rc attempt=0
    RUN_KEY=$(run_key "$@")
    log "job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_JOB_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})}" \
        "on ${SLURM_JOB_NODELIST:-$(hostname)}, restart ${SLURM_RESTART_COUNT:-0}," \
        "commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
    read_retries
    check_gpus_per_rank
    schedule_stop
    # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch allocation.
    if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
    fi
    export PYTHONUNBUFFERED=1
    log_node_storage
    set_caches
    activate_environment
    launch_command "$@"
    if [[ -n "$STOP_SIGNAL" ]]; then  # the signal came during set-up: nothing to save yet
        log "stop signal (SIG$STOP_SIGNAL) before the training started: nothing saved;" \
            "not requeueing (is the time limit too short for the set-up?)"
        exit 1
    fi
    run_step
    # torchrun restarts its workers itself (--max-restarts); with srun the script relaunches.
    while [[ -z "$STOP_SIGNAL" && "$TRANSIENT_EXITS" == *" $rc "* && "${LAUNCHER:-srun}" == srun ]] \
        && ((attempt < RETRIES)); do
        attempt=$((attempt + 1))
        log "transient failure (exit code $rc): relaunch $attempt of at most $RETRIES (RETRIES)," \
            "resuming from the last checkpoint"
        run_step
    done
    report_stop "$rc"

    local wants_requeue=0
    if [[ "${LAUNCHER:-srun}" == torchrun ]]; then
        [[ "$FIRST_SIGNAL" == USR1 && $rc -ne 0 ]] && wants_requeue=1
    elif ((rc == EXIT_REQUEUE)); then
        wants_requeue=1
    fi
    if ((wants_requeue)); then
        # The limit's SIGTERM may overtake a stop that began with USR1 (a slow checkpoint):
        # the checkpoint was written all the same, so the job goes on unless it was cancelled.
        if [[ "$STOP_SIGNAL" == TERM && "$FIRST_SIGNAL" == USR1 ]] && at_time_limit; then
            log "the time limit's SIGTERM came during the stop that USR1 began; the checkpoint" \
                "is written, so the job goes on (a larger STOP_GRACE avoids the race)"
        elif [[ "$STOP_SIGNAL" == TERM ]]; then
            log "stopped by SIGTERM (scancel or the hard limit): checkpoint kept, no requeue"
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
