#!/usr/bin/env bash
# One-shot GPU validation (issue 6 item 5; DESIGN §10): build the CUDA extension, run the CUDA tests and
# the benchmarks, write a JSON summary — one call on one H200, at most BUDGET_S (default 560) seconds.
#
#   On the device machine, from the repo root, carrying the CUTLASS headers (third_party/ is git-ignored):
#     run(command="benches/device_check.sh", carry=["third_party/cutlass"], timeout_s=600)
#   Anywhere with a GPU: OUT=/tmp/dc benches/device_check.sh
#
# Outputs in $OUT (default ./device_check_out); the device tool returns at most 8 files, so every step
# writes into ONE log (device_check.log, a header per step) and only JSON/XML artefacts get files:
#   summary.json      per step: exit code and seconds; per benchmark: median µs and its extra_info;
#                     per failed test or test with record_property values (e.g. near_ties): those
#   device_check.log  all steps' output
#   <step>.json/.xml  artefacts a step writes (pytest-benchmark JSON, junit XML with near-tie counts)
#
# Structure: each check is one `step NAME TIMEOUT_S COMMAND...` line in the STEPS section, grouped by op
# family with a comment. A failing step does not stop the later ones; the exit code is non-zero if any
# step failed. To add checks, append `step` lines to the section (keep the total inside ~6 minutes) and
# name artefacts "$OUT/<step>.json" so summary.json picks up benchmark results automatically.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_check_out}
mkdir -p "$OUT"
LOG="$OUT/device_check.log"
: > "$LOG"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 FLASHMAP_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STEPS_JSON="$OUT/.steps.jsonl"
: > "$STEPS_JSON"
FAILED=0

# The device tool allows 600 s per command: every step's limit is cut to what is left of BUDGET_S (minus
# 15 s for the summary), and a step with no time left is skipped (rc 124), so summary.json is always written.
BUDGET_S=${BUDGET_S:-560}
DEADLINE=$(( $(date +%s) + BUDGET_S - 15 ))

step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    echo "===== [$name] skipped: the ${BUDGET_S}s budget is spent" >> "$LOG"
    echo "{\"step\": \"$name\", \"rc\": 124, \"seconds\": 0, \"skipped\": true}" >> "$STEPS_JSON"
    echo "[$name] skipped (budget spent)"; FAILED=1; return
  fi
  echo "===== [$name] $* (limit ${limit}s)" >> "$LOG"
  local t0 rc ms
  t0=$(date +%s%N)
  timeout "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "===== [$name] rc=$rc in ${ms} ms" >> "$LOG"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((ms / 1000)).$(printf %03d $((ms % 1000)))}" >> "$STEPS_JSON"
  echo "[$name] rc=$rc $((ms / 1000))s"
  [ "$rc" -eq 0 ] || FAILED=1
}

# ---------------------------------------------------------------------------------------------- STEPS
# Environment and build (the extension is tied to the local torch: always built here, in place).
step env 60 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -2;
  '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"'
step build 360 "$PY" setup.py build_ext --inplace

# Fused acceptance step `verify` (issue 2): python_tests/test_verify_*.py on CUDA (exact vs the fp64
# reference, edge cases, CUDA-graph replay, chi-square losslessness, opcheck), then verify vs the PyTorch
# composition at K = 16, V = 151,936, B 1/8/64 (targets: <= 10 us at B = 1, >= 60% of HBM at B = 64).
step verify_tests 240 "$PY" -m pytest -q python_tests/test_verify_exact.py python_tests/test_verify_edge.py \
  python_tests/test_verify_stats.py python_tests/test_verify_opcheck.py -k cuda -o addopts="" \
  --junitxml="$OUT/verify_tests.xml"
step bench_verify 180 "$PY" -m pytest -q benches/bench_verify.py -k cuda -o addopts="" --benchmark-only \
  --benchmark-columns=median,iqr,rounds --benchmark-json="$OUT/bench_verify.json"

# DiT drafter kernels (issue 6): every CUDA op vs the fp64 oracle under the error budget, CUDA graphs,
# torch.compile, the fused draft step vs the reference drafter, draft_block's graph replay over rounds and
# in generate, the drafter's noise (CPU == CUDA bit for bit, no sync, graph capture); then the benchmark.
step dit_tests 300 "$PY" -m pytest -q -m cuda python_tests/test_dit_ops.py python_tests/test_dit_fused.py \
  python_tests/test_draft_graph.py python_tests/test_drafter_noise.py -o addopts="" --junitxml="$OUT/dit_tests.xml"
# End-to-end decoding round (issue 6 item 6) on a Qwen3-8B-shaped bf16 target with random weights: per
# round draft / verify forward / verify op / bookkeeping, fused vs reference drafter, 1 and 2 steps (DESIGN
# §10 target: all but the forward <= 10% of it). About a minute; before bench_draft, whose torch.compile
# variants are the slowest step. Writes bench_round.json (pytest-benchmark layout) after each variant.
step bench_round 150 "$PY" benches/bench_round.py --json "$OUT/bench_round.json"
step bench_draft 420 "$PY" -m pytest -q benches/bench_draft.py -o addopts="" --benchmark-only \
  --benchmark-columns=median,iqr,rounds --benchmark-json="$OUT/bench_draft.json"

# ------------------------------------------------------------------------------------------ SUMMARY
"$PY" - "$OUT" <<'EOF' >> "$LOG" 2>&1
import glob, json, os, sys
out = sys.argv[1]
summary = {"steps": [json.loads(l) for l in open(os.path.join(out, ".steps.jsonl")) if l.strip()], "benchmarks": {}}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    if path.endswith("summary.json"):
        continue
    try:
        data = json.load(open(path))
    except ValueError:
        continue
    for b in data.get("benchmarks", []):
        summary["benchmarks"][b["fullname"]] = {"group": b.get("group"), "median_us": b["stats"]["median"] * 1e6,
                                               **b.get("extra_info", {})}
import xml.etree.ElementTree as ET
for path in sorted(glob.glob(os.path.join(out, "*.xml"))):  # junit: failures and record_property values
    for case in ET.parse(path).iter("testcase"):
        name = case.get("classname", "") + "::" + case.get("name", "")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        failed = case.find("failure") is not None or case.find("error") is not None
        if props or failed:
            summary.setdefault("tests", {})[name] = {"failed": failed, **props}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary["steps"]))
EOF
rm -f "$STEPS_JSON"
exit "$FAILED"
