#!/usr/bin/env bash
# One-shot GPU validation (issue 11; DESIGN.md §10): build the CUDA extension, run the CUDA tests, then the
# benchmarks, ordered by value, in at most BUDGET_S (default 520) seconds on one H200.
#
#   From a fresh clone, here (no GPU needed): `make cutlass-min` (the trimmed, git-ignored CUTLASS headers;
#   `make cuda-check` builds them too), `make checkpoints` is NOT needed (no step reads the committed
#   weights, which stay out of what travels). Then the one command, on the device machine:
#     run(command="bash benches/device_check.sh", carry=["third_party/cutlass-min"], timeout_s=600)
#   What travels: tracked files + third_party/cutlass-min, checked <= 56 MiB by
#   python_tests/bench/test_device_payload.py (the device tool's limit is 64 MiB).
#   Anywhere with a GPU: OUT=/tmp/dc bash benches/device_check.sh
#   A CPU dry run of the script itself (build CPU-only, CUDA tests skip, benchmarks run their CPU smoke
#   shapes): FLASHMAP_CUDA=0 OUT=/tmp/dc bash benches/device_check.sh
#
# Steps, in this order (a step's limit is cut to what is left of the budget; a failed build skips the rest):
#   env, build            toolkit and GPU facts; setup.py build_ext --inplace (CUDA_HOME from
#                         scripts/cuda_home.sh: a wrapper nvcc on PATH makes torch guess wrong)
#   verify_tests          python_tests/verify/test_verify_*.py -k cuda   (CUDA_LAUNCH_BLOCKING=1: an illegal address
#   dit_op_tests          DiT ops -m cuda                          is reported at its kernel, not later)
#   dit_step_tests        fused draft step / graph / noise -m cuda
#   bench_verify          verify vs the PyTorch composition, K = 16, V = 151,936, B 1/8/64
#   bench_draft_<variant> draft step, one process per variant (fused, fused-eager, eager; never the
#                         torch.compile variant): pytest-benchmark writes its JSON only when its process ends
#   bench_round           one decoding round end to end (Qwen3-8B shape), JSON rewritten per variant
#   dit_compile_tests     the torch.compile tests (inductor compile time), last
# Every pytest step runs under `timeout -k` (a hung CUDA context cannot outlive its limit).
#
# Outputs in $OUT (default ./device_check_out); the device tool returns at most 8 files, so there are three:
#   summary.json          rewritten after EVERY step: per step rc and seconds; per benchmark median µs and
#                         extra_info; per failed test (or test with record_property values, e.g. near_ties)
#   device_check.log      every step's output, a header per step
#   artefacts.tar.gz      the raw per-step files (pytest-benchmark JSON, junit XML), re-packed after each step
# At the end a one-screen summary is printed (the device tool returns the output's last 12,000 characters).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/device_check_out}
WORK=$(mktemp -d)  # per-step artefacts, packed into $OUT/artefacts.tar.gz
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: > "$LOG"
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-520}
START=$(date +%s)
DEADLINE=$(( START + BUDGET_S - 10 ))  # 10 s for the last summary
KILL_AFTER=5                          # `timeout -k`: SIGKILL this long after SIGTERM
FAILED=0
SKIP_REST=""

export PYTHONUNBUFFERED=1 FLASHMAP_CUDA=${FLASHMAP_CUDA:-1} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$FLASHMAP_CUDA" = 1 ]; then
  CUDA_HOME=$(scripts/cuda_home.sh) || { echo "no CUDA toolkit found (scripts/cuda_home.sh)" | tee -a "$LOG"; exit 1; }
  export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
fi
if [ -z "${CUTLASS_DIR:-}" ] && [ -d third_party/cutlass-min/include/cute ]; then
  export CUTLASS_DIR=$PWD/third_party/cutlass-min
fi

summarize() {  # rewrites $OUT/summary.json from the steps so far and the artefacts in $WORK
  tar -czf "$OUT/artefacts.tar.gz" -C "$WORK" . 2>/dev/null
  if [ "${1:-}" = --print ]; then
    "$PY" benches/device_summary.py "$WORK" "$OUT/summary.json" --print 2>&1 | tee -a "$LOG"
  else
    "$PY" benches/device_summary.py "$WORK" "$OUT/summary.json" >> "$LOG" 2>&1
  fi
}

step() {  # step NAME LIMIT_S [env VAR=VALUE ...] COMMAND...
  local name=$1 limit=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) - KILL_AFTER ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ -n "$SKIP_REST" ] || [ "$limit" -le 0 ]; then
    local why=${SKIP_REST:-"the ${BUDGET_S}s budget is spent"}
    echo "===== [$name] skipped: $why" >> "$LOG"
    echo "{\"step\": \"$name\", \"rc\": 124, \"seconds\": 0, \"skipped\": \"$why\"}" >> "$WORK/steps.jsonl"
    FAILED=1; summarize; return
  fi
  echo "===== [$name] $* (limit ${limit}s)" >> "$LOG"
  local t0 rc ms
  t0=$(date +%s%N)
  timeout -k "$KILL_AFTER" "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "===== [$name] rc=$rc in ${ms} ms" >> "$LOG"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((ms / 1000)).$(printf %03d $((ms % 1000))), \"limit\": $limit}" \
    >> "$WORK/steps.jsonl"
  echo "[$name] rc=$rc $((ms / 1000))s (limit ${limit}s)"
  [ "$rc" -eq 0 ] || FAILED=1
  summarize
  return "$rc"
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts="")
TESTS=(env CUDA_LAUNCH_BLOCKING=1 "${PYTEST[@]}")
# shellcheck disable=SC2054  # the commas belong to the option
BENCH=("${PYTEST[@]}" --benchmark-only --benchmark-columns=median,iqr,rounds)

# ---------------------------------------------------------------------------------------------- STEPS
# shellcheck disable=SC2016  # expanded by the inner bash
step env 20 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
  echo "CUDA_HOME=${CUDA_HOME:-} CUTLASS_DIR=${CUTLASS_DIR:-}"; "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version | tail -2;
  '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"'
step build 240 "$PY" setup.py -q build_ext --inplace || SKIP_REST="the build failed"

# Fused acceptance `verify`: exact vs the fp64 reference, edge cases, graph replay, chi-square, opcheck.
step verify_tests 80 "${TESTS[@]}" python_tests/verify/test_verify_exact.py python_tests/verify/test_verify_edge.py \
  python_tests/verify/test_verify_stats.py python_tests/verify/test_verify_opcheck.py -k cuda --junitxml="$WORK/verify_tests.xml"
# DiT drafter kernels vs the fp64 oracle under the error budget; then the fused step, graph replay, seeded
# noise. Two steps, so that a timeout (pytest writes its junit XML only at the end) loses one half; the
# torch.compile test (inductor: the slowest to start) runs last of all, after the benchmarks.
NO_COMPILE="not torch_compile"
step dit_op_tests 80 "${TESTS[@]}" -m cuda -k "$NO_COMPILE" python_tests/dit/test_dit_ops.py \
  --junitxml="$WORK/dit_op_tests.xml"
step dit_step_tests 80 "${TESTS[@]}" -m cuda -k "$NO_COMPILE" python_tests/dit/test_dit_fused.py \
  python_tests/dit/test_draft_graph.py python_tests/dit/test_drafter_noise.py --junitxml="$WORK/dit_step_tests.xml"

step bench_verify 40 "${BENCH[@]}" benches/bench_verify.py -k cuda --benchmark-json="$WORK/bench_verify.json"
# Draft step, Qwen3-8B drafter shape: one process per variant, each with its own JSON.
for variant in fused fused-eager eager; do
  case $variant in
    fused) select="fused and not fused-eager" ;;
    eager) select="eager and not fused-eager" ;;
    *) select=$variant ;;
  esac
  step "bench_draft_$variant" 45 "${BENCH[@]}" benches/bench_draft.py -k "$select" \
    --benchmark-json="$WORK/bench_draft_$variant.json"
done
step bench_round 110 "$PY" benches/bench_round.py --json "$WORK/bench_round.json"
step dit_compile_tests 60 "${TESTS[@]}" -m cuda -k torch_compile python_tests/dit/test_dit_ops.py \
  --junitxml="$WORK/dit_compile_tests.xml"

# ------------------------------------------------------------------------------------------ SUMMARY
summarize --print
echo "total $(( $(date +%s) - START ))s of ${BUDGET_S}s; full log: device_check.log; numbers: summary.json"
rm -rf "$WORK"
exit "$FAILED"
