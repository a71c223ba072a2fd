#!/bin/bash
# Train one run in N dependent segments: N slurm/train.sbatch jobs, each starting after the
# previous one has ended well (afterok) and resuming the same run from its latest checkpoint.
# Run it on the login node:
#   slurm/chain.sh N [key=value ...]
#   e.g. slurm/chain.sh 4 run.name=long-run train.epochs=400
# A segment ends at its time limit (USR1, checkpoint) or after run.max_steps_this_segment
# steps; it does not requeue itself (AUTO_REQUEUE=0) but exits 0 after its checkpoint, so
# Slurm records it COMPLETED and the next segment continues the run. A segment that failed
# (an error, a time-out without checkpoint, scancel) ends the chain: the later segments are
# cancelled (--kill-on-invalid-dep) instead of training on after a broken one.
# The run name is run.name=... if given, else $RUN_NAME, else chain-<date>-<time>.
# Slurm options for every segment go in sbatch's input variables, e.g.
#   SBATCH_TIMELIMIT=4:00:00 SBATCH_PARTITION=... slurm/chain.sh 3
# Prints the job ids, one per line, in order (details go to stderr).
set -euo pipefail

die() { echo "chain.sh: $*" >&2; exit 2; }

[[ $# -ge 1 && "$1" =~ ^[1-9][0-9]*$ ]] || die "usage: slurm/chain.sh SEGMENTS [key=value ...]"
segments=$1
shift
cd "$(dirname "${BASH_SOURCE[0]}")/.."  # the project root: logs/ and runs/ live there

run_name=${RUN_NAME:-chain-$(date +%Y%m%d-%H%M%S)}
for arg in "$@"; do
    if [[ "$arg" == run.name=* ]]; then
        run_name=${arg#run.name=}
    fi
done
# The name travels in --export, where a comma would split it.
[[ "$run_name" =~ ^[A-Za-z0-9._-]+$ ]] || die "run name '$run_name': use letters, digits, . _ -"

mkdir -p logs  # Slurm does not create the log folder; a missing one loses the output
previous=""
for ((segment = 1; segment <= segments; segment++)); do
    dependency=()
    if [[ -n "$previous" ]]; then
        dependency=(--dependency="afterok:$previous" --kill-on-invalid-dep=yes)
    fi
    # ${a[@]+...}: an empty array is fine under `set -u` on bash older than 4.4 too.
    previous=$(sbatch --parsable ${dependency[@]+"${dependency[@]}"} \
        --export="ALL,RUN_NAME=$run_name,AUTO_REQUEUE=0" slurm/train.sbatch "$@")
    previous=${previous%%;*}  # --parsable prints "id" or "id;cluster"
    echo "$previous"
    echo "segment $segment/$segments: job $previous" >&2
done
echo "run '$run_name' -> runs/$run_name; watch with: squeue --me" >&2
