#!/usr/bin/env bash
# Every GPU figure of docs/performance.md in one call, into one results file.
#
#   benchmarks/gpu_day.sh          on a GPU node (slurm/interactive.sh): under 8 minutes on
#                                  one H100 or H200
#   benchmarks/gpu_day.sh --tiny   anywhere, on the CPU, in under 2 minutes: the same steps
#                                  at toy sizes, so that the script cannot rot between GPU days
#
# Steps, each bounded by `timeout` so that one stuck step cannot eat the others' time: the GPU
# tests; trainer vs raw loop (bench_trainer); the 0.8B language model eager and compiled
# against a hand-written loop, with MFU (bench_lm); a 9 GB checkpoint saved, saved in the
# background and loaded against the disk (bench_checkpoint); a 1 B tied Qwen2 from a config
# under fsdp: steps, save, resume, export read back by transformers, plan (bench_hub). The
# figure lines of each are gathered at the end of reports/gpu-day-<time>.txt, after the full
# output.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
tiny=false
case "${1:-}" in
    --tiny) tiny=true ;;
    "") ;;
    *) echo "usage: benchmarks/gpu_day.sh [--tiny]" >&2; exit 2 ;;
esac
mkdir -p reports
out=reports/gpu-day-$(date +%Y%m%d-%H%M%S).txt
failed=0

# step <seconds> <command...>: run it, its output into the results file; a failure is
# recorded and the next step still runs.
step() {
    local limit=$1
    shift
    echo "== $*" | tee -a "$out"
    if ! timeout "$limit" "$@" 2>&1 | tee -a "$out"; then
        echo "!! failed or timed out after at most ${limit} s: $*" | tee -a "$out"
        failed=1
    fi
}

# hub <step ...>: the step, where the hf extra (transformers) is installed.
hub() {
    if "$PY" -c 'import transformers' 2>/dev/null; then
        "$@"
    else
        echo "== hub: skipped, the hf extra is not installed (pip install -e '.[hf]')" | tee -a "$out"
    fi
}

if $tiny; then
    # Limits for a hang only: on a CPU shared with other work (a test suite, CI) a toy step
    # that takes 30 s alone took over 120 s. The GPU day's own limits below keep its budget.
    step 900 "$PY" -m pytest -m gpu tests/test_gpu.py -q -rs -p no:cacheprovider
    step 900 "$PY" benchmarks/bench_trainer.py --device cpu --rounds 1 --mlp-steps 4 --cnn-steps 2
    step 900 "$PY" benchmarks/bench_lm.py --device cpu --hidden 64 --depth 2 --context 32 \
        --batch 2 --steps 4 --rounds 1 --peak-tflops 1
    step 900 "$PY" benchmarks/bench_checkpoint.py --device cpu --gib 0.002 --width 64 \
        --rounds 1 --plan-mb 2
    hub step 900 "$PY" benchmarks/bench_hub.py --device cpu --hidden 64 --layers 2 --vocab 512 \
        --context 32 --batch 4 --steps 3
else
    "$PY" -c 'import sys, torch; torch.cuda.is_available() or sys.exit("benchmarks/gpu_day.sh: no CUDA device here: run it in a GPU job (slurm/interactive.sh), or with --tiny")'
    step 300 "$PY" -m pytest -m gpu tests/test_gpu.py -q -rs -p no:cacheprovider
    step 60 "$PY" benchmarks/bench_trainer.py --device cuda --rounds 5
    step 150 "$PY" benchmarks/bench_lm.py --device cuda
    step 150 "$PY" benchmarks/bench_checkpoint.py --device cuda --gib 8.4 --rounds 2
    hub step 240 "$PY" benchmarks/bench_hub.py --device cuda
fi

figures=$(grep -E '^(trainer/raw|lm|checkpoint|hub): |passed|failed' "$out" || true)
printf '== figures\n%s\n' "$figures" | tee -a "$out"
echo "results: $out"
exit "$failed"
