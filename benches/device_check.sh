#!/usr/bin/env bash
# One-shot GPU validation (DESIGN.md §10): build the CUDA extension, run the CUDA tests, then the
# benchmarks, in priority order, in at most BUDGET_S (default 530) seconds on one GPU (sized for an H200).
#
#   On a CUDA machine (nvcc and a CUDA torch), in a checkout that holds third_party/cutlass-min
#   (`make cutlass-min`, which needs no GPU; `make checkpoints` is not needed: no step reads the weights):
#     bash benches/device_check.sh                  # writes ./device_check_out/
#     OUT=/tmp/dc bash benches/device_check.sh      # elsewhere
#   `make device-preflight` (this script with --preflight) checks first, in one line, that cutlass-min is
#   there, that every step's files are present and that the default steps' shares sum to the budget.
#   A rerun of some steps only, or an optional step:
#   STEPS=build,dit_switch_tests,bench_gamma (env and build always run when STEPS is set; the others are
#   left out of the schedule, their shares unused). A CPU dry run of the script itself (build CPU-only,
#   CUDA tests skip, benchmarks run their CPU smoke shapes): FLASHMAP_CUDA=0 OUT=/tmp/dc bash benches/device_check.sh
#
# The schedule. Each step has a share of the budget (SHARE below, seconds, in priority order; the default
# steps' shares sum to BUDGET_S - 10, the 10 s left for the last summary) and must end by START + its share +
# the shares before it: time an early step leaves unused goes to the later ones, and a step that runs long is
# cut at its end, or eats into the later ones (the lowest priority last, never the other way). Every step is
# told what is left: its limit and the seconds to the end of the budget in its log header, its result line
# and its environment (DEVICE_CHECK_STEP_S, DEVICE_CHECK_LEFT_S). The shares (the H200 build took 38 s):
#   env (20)          nvidia-smi, nvcc --version, a torch import (5 s of it is the kill margin)
#   build (80)        9 translation units (38 s on the H200 host of 2026-12-04). CPU time of each, compiled alone with the build's flags on one
#                     core of an Intel Xeon (/usr/bin/time user+sys): linear.cu 48.6 s, dit_cpu.cpp 14.3, dit_cuda.cpp 13.1,
#                     verify_cuda.cpp 12.3, verify_cpu.cpp 11.9, attention.cu 9.6, verify_kernel.cu 9.1,
#                     registration.cpp 7.8, norm.cu 3.8: 131 s in a row. With ninja (on PATH, else
#                     the python's `ninja` module, else a wheel in .whl/ninja-*.whl) they compile in
#                     parallel: ~50 s + link + setup.py's start; the share leaves room for a slower host.
#                     Without ninja the build is serial: its share becomes SERIAL_BUILD_S (300, 131 s x 2
#                     + link) and the last steps shrink.
#   dit_op_tests (55), dit_step_tests (60): torch import and CUDA context ~10 s each, the rest the tests (ms
#                     each on a GPU; the fp64 oracles on the CPU dominate)
#   dit_switch_tests (80): the same DiT tests with every new kernel path switched on, plus the switch
#                     equality tests (4 child processes of ~10 s, each with 1000 replays of a small graphed step)
#   bench_draft_fused (25), bench_draft_switched (25): pytest-benchmark, 30 rounds of ms calls per shape
#   profile_step (25) the 8B drafter built on the GPU (~5 s), 5 eager steps and 5 graph replays under
#                     torch.profiler (CUPTI start ~3 s), 50 timed replays
#   split_sweep (45)  the L = 1024 1-step draft at FLASHMAP_LINEAR_MAX_SPLITS 2, 4, 8: 3 processes of ~15 s
#   bench_gamma (55)  an 8B-shaped random target built on the GPU (~10 s), forwards, AR and 5 acceptance
#                     lengths of ~160 tokens each (~20 s of decoding)
#   bench_train (50)  the same target, features of 16 x 1024 tokens, 20 steps of train flow (qwen3-8b
#                     preset), its ~5 GB final checkpoint
#   Optional (STEPS=...; shares from the validated run of 2026-12-04): verify_tests (60), bench_verify (30),
#                     bench_draft_fused-eager (25), bench_draft_eager (25), bench_round (55), dit_compile_tests (45)
#
# Steps, in this order (a failed build skips the rest):
#   env, build            toolkit and GPU facts; setup.py build_ext --inplace (CUDA_HOME from
#                         scripts/cuda_home.sh: a wrapper nvcc on PATH makes torch guess wrong)
#   dit_op_tests          DiT ops -m cuda                          (CUDA_LAUNCH_BLOCKING=1: an illegal address
#   dit_step_tests        fused draft step / graph / noise / precomputed modulations / fused norms / static target and
#                         the graphed round's bookkeeping -m cuda
#   dit_switch_tests      the DiT op and step tests under SWITCHES (all new kernel paths on) + test_dit_switches
#   bench_draft_fused     draft step, fused kernels as they are (default switches)
#   bench_draft_switched  the same with SWITCHES
#   profile_step          per-kernel table of the L = 1024 1-step fused draft, eager and graphed (benches/profile_step.py)
#   split_sweep           the L = 1024 1-step fused draft at 2, 4 and 8 split-K splits at most
#   bench_gamma           the speedup-vs-γ curve on the graphed 8B-shaped target (benches/bench_gamma.py)
#   bench_train           a short train flow run on the GPU (benches/bench_train.py)
#   (optional) verify_tests, bench_verify, bench_draft_<fused-eager|eager>, bench_round, dit_compile_tests
# Every step runs under `timeout -k` (a hung CUDA context cannot outlive its limit).
#
# Outputs in $OUT (default ./device_check_out), three files:
#   summary.json          rewritten after EVERY step: per step rc and seconds; per benchmark median µs and
#                         extra_info; per failed test (or test with record_property values, e.g. near_ties)
#   device_check.log      every step's output, a header per step
#   artefacts.tar.gz      the raw per-step files (pytest-benchmark JSON, junit XML, profile_step.md), re-packed
#                         after each step
# At the end a one-screen summary is printed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-530}
PREFLIGHT=0
[ "${1:-}" = --preflight ] && PREFLIGHT=1

# Optional steps run only when STEPS names them; their shares lie outside the default schedule's sum. The
# verify v2 run (FLASHMAP_VERIFY_KERNEL=v2; DESIGN.md §3.1), in one call, with the FlashInfer and curand
# headers carried (`make flashinfer-headers`):
#   STEPS=verify_tests,verify_tests_v2,bench_verify_side bash benches/device_check.sh
#   (carry third_party/cutlass-min, third_party/flashinfer, third_party/curand; 20 + 115 + 60 + 90 + 200 s)
#   verify_tests_v2 (90)    the verify tests again with the v2 kernel, plus test_verify_v2.py
#   bench_verify_side (200) benches/bench_verify_side.py: v1, v2, the composition and FlashInfer (its nvcc
#                           build ~60 s of it), B 1/8/64 x greedy/T=1/top-p, µs and % of copy bandwidth
declare -A SHARE=([env]=20 [build]=80 [dit_op_tests]=55 [dit_step_tests]=60 [dit_switch_tests]=80
  [bench_draft_fused]=25 [bench_draft_switched]=25 [profile_step]=25 [split_sweep]=45 [bench_gamma]=55 [bench_train]=50
  [verify_tests]=60 [bench_verify]=30 [bench_draft_fused-eager]=25 [bench_draft_eager]=25 [bench_round]=55
  [dit_compile_tests]=45 [verify_tests_v2]=90 [bench_verify_side]=200)
DEFAULT_STEPS=env,build,dit_op_tests,dit_step_tests,dit_switch_tests,bench_draft_fused,bench_draft_switched,profile_step,split_sweep,bench_gamma,bench_train
ACTIVE_STEPS=${STEPS:-$DEFAULT_STEPS}
# Every new DiT kernel path on (csrc/dit/dit_switches.h, fixup_counters.h, drafters/flashmap/fused.py); the
# batched fixup is the cluster's alternative and is compared bitwise in test_dit_switches.py.
SWITCHES=(FLASHMAP_DIT_CLUSTER_SPLITK=1 FLASHMAP_DIT_LENGTH_SPLITS=1 FLASHMAP_DIT_PARALLEL_MERGE=1
          FLASHMAP_DIT_NODE_WORKSPACES=1 FLASHMAP_DIT_PRECOMPUTED_MODS=1 FLASHMAP_DIT_PDL=1
          FLASHMAP_DIT_FUSED_NORMS=1)
SERIAL_BUILD_S=300  # the build's share without ninja (the estimate above)
SCHEDULED=0         # sum of the shares of the steps so far
PROBLEMS=()         # --preflight: what would fail there

# ---------------------------------------------------------------------------------------------- PREFLIGHT
preflight_start() {
  local sum=0 s
  for s in ${DEFAULT_STEPS//,/ }; do sum=$((sum + SHARE[$s])); done
  [ "$sum" -eq $((BUDGET_S - 10)) ] || PROBLEMS+=("the step shares sum to ${sum}s, not BUDGET_S - 10 = $((BUDGET_S - 10))s")
  [ -d third_party/cutlass-min/include/cute ] || PROBLEMS+=("third_party/cutlass-min is missing: run \`make cutlass-min\`")
}

preflight_step() {  # the files a step names must be in the checkout
  local a
  for a in "$@"; do
    case $a in
      -*|*' '*) ;;
      *.py|*.sh) [ -f "$a" ] || PROBLEMS+=("step $STEP_NAME: $a is missing") ;;
    esac
  done
}

preflight_end() {
  if [ "${#PROBLEMS[@]}" -gt 0 ]; then
    local joined
    joined=$(printf '; %s' "${PROBLEMS[@]}")
    echo "device preflight FAILED: ${joined#; }"
    exit 1
  fi
  local n=${DEFAULT_STEPS//[^,]/}
  echo "device preflight ok: $(( ${#n} + 1 )) steps, shares sum to $((BUDGET_S - 10))s, their files present"
  exit 0
}

if [ "$PREFLIGHT" = 1 ]; then
  preflight_start
else
  OUT=${OUT:-$PWD/device_check_out}
  WORK=$(mktemp -d)  # per-step artefacts, packed into $OUT/artefacts.tar.gz
  mkdir -p "$OUT"
  LOG="$OUT/device_check.log"
  : > "$LOG"
fi
START=$(date +%s)
DEADLINE=$(( START + BUDGET_S - 10 ))  # 10 s for the last summary
KILL_AFTER=5                          # `timeout -k`: SIGKILL this long after SIGTERM
FAILED=0
SKIP_REST=""

export PYTHONUNBUFFERED=1 FLASHMAP_CUDA=${FLASHMAP_CUDA:-1} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$PREFLIGHT" = 0 ] && [ "$FLASHMAP_CUDA" = 1 ]; then
  CUDA_HOME=$(scripts/cuda_home.sh) || { echo "no CUDA toolkit found (scripts/cuda_home.sh)" | tee -a "$LOG"; exit 1; }
  export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
fi
if [ -z "${CUTLASS_DIR:-}" ] && [ -d third_party/cutlass-min/include/cute ]; then
  export CUTLASS_DIR=$PWD/third_party/cutlass-min
fi

# torch's BuildExtension compiles in parallel only through ninja: on PATH, else the python's `ninja`
# module, else a wheel placed in .whl/ (ninja-*.whl, unpacked: the binary is inside, under *.data/scripts/ in
# ninja 1.13's wheel, ninja/data/bin/ in older ones). Else the build is serial.
ensure_ninja() {
  command -v ninja >/dev/null 2>&1 && return 0
  local bin whl
  bin=$("$PY" -c "import ninja; print(ninja.BIN_DIR)" 2>/dev/null)
  if [ -n "$bin" ] && [ -x "$bin/ninja" ]; then PATH="$bin:$PATH"; return 0; fi
  whl=$(ls .whl/ninja-*.whl 2>/dev/null | head -n1)
  if [ -n "$whl" ] && "$PY" -m zipfile -e "$whl" "$WORK/ninja" >/dev/null 2>&1; then
    bin=$(dirname "$(find "$WORK/ninja" -type f \( -path '*/bin/ninja' -o -path '*.data/scripts/ninja' \) | head -n1)")
    chmod +x "$bin/ninja" 2>/dev/null && PATH="$bin:$PATH" && ninja --version >/dev/null 2>&1 && return 0
  fi
  return 1
}

summarize() {  # rewrites $OUT/summary.json from the steps so far and the artefacts in $WORK
  tar -czf "$OUT/artefacts.tar.gz" -C "$WORK" . 2>/dev/null
  if [ "${1:-}" = --print ]; then
    "$PY" benches/device_summary.py "$WORK" "$OUT/summary.json" --print 2>&1 | tee -a "$LOG"
  else
    "$PY" benches/device_summary.py "$WORK" "$OUT/summary.json" >> "$LOG" 2>&1
  fi
}

step() {  # step NAME [env VAR=VALUE ...] COMMAND...   (its share: SHARE[NAME])
  local name=$1
  shift
  STEP_NAME=$name
  [ -n "${SHARE[$name]:-}" ] || { echo "device_check: step $name has no SHARE" >&2; exit 2; }
  [ "$PREFLIGHT" = 1 ] && { preflight_step "$@"; return 0; }  # every step's files, optional ones too
  if [ "$name" != env ] && [ "$name" != build ] && [[ ",$ACTIVE_STEPS," != *",$name,"* ]]; then
    return 0  # not scheduled: no share, no line
  fi
  SCHEDULED=$((SCHEDULED + SHARE[$name]))
  local now end left limit
  now=$(date +%s)
  end=$((START + SCHEDULED))
  [ "$end" -gt "$DEADLINE" ] && end=$DEADLINE
  left=$((DEADLINE - now))
  limit=$((end - now - KILL_AFTER))
  if [ -n "$SKIP_REST" ] || [ "$limit" -le 0 ]; then
    local why=${SKIP_REST:-"its share is spent (${left}s of the ${BUDGET_S}s budget left)"}
    echo "===== [$name] skipped: $why" >> "$LOG"
    echo "[$name] skipped: $why"
    echo "{\"step\": \"$name\", \"rc\": 124, \"seconds\": 0, \"skipped\": \"$why\"}" >> "$WORK/steps.jsonl"
    FAILED=1; summarize; return 124
  fi
  echo "===== [$name] $* (limit ${limit}s, ${left}s of the budget left)" >> "$LOG"
  local t0 rc ms
  t0=$(date +%s%N)
  timeout -k "$KILL_AFTER" "$limit" env DEVICE_CHECK_STEP_S="$limit" DEVICE_CHECK_LEFT_S="$left" "$@" >> "$LOG" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "===== [$name] rc=$rc in ${ms} ms" >> "$LOG"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((ms / 1000)).$(printf %03d $((ms % 1000))), \"limit\": $limit}" \
    >> "$WORK/steps.jsonl"
  echo "[$name] rc=$rc $((ms / 1000))s (limit ${limit}s, $((DEADLINE - $(date +%s)))s of the budget left)"
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
step env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
  echo "CUDA_HOME=${CUDA_HOME:-} CUTLASS_DIR=${CUTLASS_DIR:-}"; "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version | tail -2;
  '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"'
if [ "$PREFLIGHT" = 0 ] && ! ensure_ninja; then
  SHARE[build]=$SERIAL_BUILD_S
  echo "ninja not found (PATH, python module, .whl/): a serial build, share ${SERIAL_BUILD_S}s; the last steps shrink" | tee -a "$LOG"
fi
step build "$PY" setup.py -q build_ext --inplace || SKIP_REST="the build failed"

# DiT drafter kernels vs the fp64 oracle under the error budget; then the fused step, graph replay, seeded
# noise, the precomputed modulations, the static (graphed) target and the round's bookkeeping graph. Two steps, so that a timeout (pytest
# writes its junit XML only at the end) loses one half; the torch.compile test (inductor: the slowest to
# start) is optional.
NO_COMPILE="not torch_compile"
step dit_op_tests "${TESTS[@]}" -m cuda -k "$NO_COMPILE" python_tests/ops/test_dit_ops.py \
  python_tests/ops/test_dit_fused_ops.py --junitxml="${WORK:-}/dit_op_tests.xml"
step dit_step_tests "${TESTS[@]}" -m cuda -k "$NO_COMPILE" python_tests/drafters/test_dit_fused.py \
  python_tests/drafters/test_draft_graph.py python_tests/test_drafter_noise.py python_tests/drafters/test_precomputed_mods.py \
  python_tests/drafters/test_fused_norms.py python_tests/target/test_static_target.py \
  python_tests/target/test_graphed_round.py --junitxml="${WORK:-}/dit_step_tests.xml"
# The same kernels' tests with every new path on, and the paths against the default kernels bitwise.
step dit_switch_tests env "${SWITCHES[@]}" "${TESTS[@]}" -m cuda -k "$NO_COMPILE" python_tests/ops/test_dit_ops.py \
  python_tests/drafters/test_dit_fused.py python_tests/drafters/test_draft_graph.py python_tests/drafters/test_precomputed_mods.py \
  python_tests/ops/test_dit_fused_ops.py python_tests/drafters/test_fused_norms.py python_tests/ops/test_dit_switches.py \
  --junitxml="${WORK:-}/dit_switch_tests.xml"

# Draft step, Qwen3-8B drafter shape: the kernels as they are, then with the switches; one process each.
FUSED="fused and not fused-eager"
step bench_draft_fused "${BENCH[@]}" benches/bench_draft.py -k "$FUSED" --benchmark-json="${WORK:-}/bench_draft_fused.json"
step bench_draft_switched env "${SWITCHES[@]}" "${BENCH[@]}" benches/bench_draft.py -k "$FUSED" \
  --benchmark-json="${WORK:-}/bench_draft_switched.json"
# Where the step's time goes: the kernels of 5 eager fused steps and 5 graph replays (default switches).
step profile_step "$PY" benches/profile_step.py --json "${WORK:-}/profile_step.json" --markdown "${WORK:-}/profile_step.md"
# shellcheck disable=SC2016  # expanded by the inner bash
# (the fused-graph L = 1,024 case exists on a GPU only: a CPU dry run has nothing to sweep)
step split_sweep bash -c '"$1" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || exit 0
  for s in 2 4 8; do FLASHMAP_LINEAR_MAX_SPLITS=$s "$@" --benchmark-json="$0/split_sweep_$s.json" \
  "benches/bench_draft.py::test_draft_step[1-1024-fused]" || exit; done' "${WORK:-}" "${BENCH[@]}"
step bench_gamma "$PY" benches/bench_gamma.py --json "${WORK:-}/bench_gamma.json"
step bench_train "$PY" benches/bench_train.py --json "${WORK:-}/bench_train.json"

# Optional (STEPS=...): the verify op's tests and benchmark, the other draft variants, the round of the
# dynamic-cache target, the torch.compile test.
step verify_tests "${TESTS[@]}" python_tests/ops/test_verify_exact.py python_tests/ops/test_verify_edge.py \
  python_tests/ops/test_verify_stats.py python_tests/ops/test_verify_opcheck.py -k cuda --junitxml="${WORK:-}/verify_tests.xml"
step verify_tests_v2 env FLASHMAP_VERIFY_KERNEL=v2 CUDA_LAUNCH_BLOCKING=1 "${PYTEST[@]}" python_tests/ops/test_verify_exact.py \
  python_tests/ops/test_verify_edge.py python_tests/ops/test_verify_stats.py python_tests/ops/test_verify_opcheck.py \
  python_tests/ops/test_verify_v2.py -k cuda --junitxml="${WORK:-}/verify_tests_v2.xml"
step bench_verify_side "$PY" benches/bench_verify_side.py --json "${WORK:-}/bench_verify_side.json"
step bench_verify "${BENCH[@]}" benches/bench_verify.py -k cuda --benchmark-json="${WORK:-}/bench_verify.json"
for variant in fused-eager eager; do
  select=$variant
  [ "$variant" = eager ] && select="eager and not fused-eager"
  step "bench_draft_$variant" "${BENCH[@]}" benches/bench_draft.py -k "$select" \
    --benchmark-json="${WORK:-}/bench_draft_$variant.json"
done
step bench_round "$PY" benches/bench_round.py --json "${WORK:-}/bench_round.json"
step dit_compile_tests "${TESTS[@]}" -m cuda -k torch_compile python_tests/ops/test_dit_ops.py \
  --junitxml="${WORK:-}/dit_compile_tests.xml"

# ------------------------------------------------------------------------------------------ SUMMARY
[ "$PREFLIGHT" = 1 ] && preflight_end
summarize --print
echo "total $(( $(date +%s) - START ))s of ${BUDGET_S}s; full log: device_check.log; numbers: summary.json"
rm -rf "$WORK"
exit "$FAILED"
