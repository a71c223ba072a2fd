#!/bin/bash
{%- set preset = cookiecutter._presets[cookiecutter.cluster] %}
{%- set slug = cookiecutter.project_slug %}
# Watch a running job. Run it on the login node, from the project root:
#   slurm/monitor.sh JOBID [NODE]   GPU view on a node of the job (default: its first node):
#                                   nvitop, else `nvidia-smi --loop=2`. Leave with q / Ctrl-C.
#   slurm/monitor.sh log JOBID      follow the job's log file
#   slurm/monitor.sh summary RUN    the trainer's own account of a run: where the time went
#                                   (data wait vs compute vs checkpoint), samples/s, GPU
#                                   memory and utilisation (runs/RUN/summary.json, written at
#                                   the end of every job; while it runs: runs/RUN/metrics.csv)
#   slurm/monitor.sh efficiency JOBID  what the job cost, every requeued segment: sacct's
#                                   elapsed time, allocation and CPU time, and seff's CPU and
#                                   memory efficiency, where the site keeps accounting
# The GPU view is a second step inside the job's allocation (srun --overlap): it uses none
# of the job's resources and ends with the job. Low GPU utilisation together with a high
# data-wait share in the summary means the input pipeline, not the GPU, is the limit.
set -euo pipefail

die() { echo "monitor.sh: $*" >&2; exit 2; }
usage="usage: slurm/monitor.sh JOBID [NODE] | log JOBID | summary RUN | efficiency JOBID"

# Runs on the compute node: the first GPU monitor found.
gpu_view() {
    if command -v nvitop >/dev/null 2>&1; then exec nvitop; fi
    if [[ -x .venv/bin/nvitop ]]; then exec .venv/bin/nvitop; fi
{%- if "nvitop" not in preset.modules %}
    if command -v module >/dev/null 2>&1 && module load nvitop >/dev/null 2>&1 \
        && command -v nvitop >/dev/null 2>&1; then
        exec nvitop
    fi
{%- endif %}
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "nvitop not found (pip install nvitop); showing nvidia-smi every 2 s"
        exec nvidia-smi --loop=2
    fi
    echo "neither nvitop nor nvidia-smi on $(hostname): no GPU view; processes of the job:"
    ps -o pid,pcpu,pmem,etime,args -u "$(id -u)"
}

job_field() {  # job_field JOBID FIELD: one field of `scontrol show job`
    scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in
    "" | -h | --help)
        echo "$usage"
        ;;
    log)
        [[ -n "${2:-}" ]] || die "$usage"
        logfile=$(job_field "$2" StdOut)
        [[ -n "$logfile" ]] || die "job $2 not found (finished jobs vanish from scontrol after a while)"
        echo "== $logfile"
        if [[ -t 1 ]]; then exec tail -n 50 -F "$logfile"; fi
        tail -n 50 "$logfile"  # not a terminal: no following
        ;;
    summary)
        [[ -n "${2:-}" ]] || die "$usage"
        run_dir="${RUNS_DIR:-runs}/$2"
        if [[ -f "$run_dir/summary.json" ]]; then
            cat "$run_dir/summary.json"
        elif [[ -f "$run_dir/metrics.csv" ]]; then
            echo "no summary yet (the run is still going); last metrics of $run_dir:"
            head -n 1 "$run_dir/metrics.csv"
            tail -n 5 "$run_dir/metrics.csv"
        else
            die "no run $run_dir"
        fi
        ;;
    efficiency)
        [[ "${2:-}" =~ ^[0-9]+(_[0-9]+)?$ ]] || die "$usage"
        if command -v sacct >/dev/null 2>&1 \
            && records=$(sacct -j "$2" --duplicates --allocations --parsable2 \
                -o JobID,State,Start,Elapsed,AllocTRES,TotalCPU,MaxRSS 2>/dev/null) \
            && [[ "$records" == *$'\n'* ]]; then
            echo "== sacct: job $2, one line per segment (requeues included)"
            printf '%s\n' "$records"
        else
            echo "== sacct: no accounting records for job $2 (sacct missing or accounting off)"
        fi
        if command -v seff >/dev/null 2>&1; then
            echo "== seff"
            seff "$2" || true
        fi
        echo "== the job's own report (end of its log)"
        logfile=$(job_field "$2" StdOut 2>/dev/null || true)
        if [[ -n "$logfile" && -f "$logfile" ]]; then
            grep -E -A 8 'where the time went:' "$logfile" | tail -n 9 || true
            grep -E 'efficiency:' "$logfile" || true
        else
            echo "log not found via scontrol (finished jobs vanish after a while): see logs/"
        fi
        ;;
    *)
        [[ "$1" =~ ^[0-9]+(_[0-9]+)?$ ]] || die "$usage"
        [[ "$(job_field "$1" JobState)" == RUNNING ]] || die "job $1 is not running"
        # srun takes numeric ids only: an array task (123_4) is addressed by its own JobId.
        jobid=$(job_field "$1" JobId)
        node_option=()
        if [[ -n "${2:-}" ]]; then
            node_option=(--nodelist="$2")
        fi
        # ${a[@]+...}: an empty array is fine under `set -u` on bash older than 4.4 too.
        exec srun --jobid="$jobid" --overlap --nodes=1 --ntasks=1 ${node_option[@]+"${node_option[@]}"} --pty \
            bash -c "$(declare -f gpu_view); gpu_view"
        ;;
esac
