#!/usr/bin/env bash
# The drafter comparison of BENCHMARKS.md: FlashMap-1, DFlash and DFlash2, each as a chain and as trees of 16
# and 32 nodes, through `flashmap bench` (fp32, 1 thread, seed 0, 64 new tokens), then paired intervals by
# `flashmap bench compare`. One bench run per (drafter, dataset, temperature), spread over the cores in CORES
# (one worker pinned to each); a run whose results.json is finished is skipped, so rerunning the same command
# after an interruption repeats at most the runs that were under way.
#
#   CORES=0,1 TEMPS=0 recipes/compare_drafters.sh          # T = 0 on two cores
#   TEMPS=0,1 OUT=runs/compare recipes/compare_drafters.sh # both temperatures
#
# Knobs (env): OUT (default runs/compare), CORES (default 0), TEMPS (default 0,1), DATASETS (default
#   gsm8k,humaneval,mtbench), N (prompts per dataset, default 16; MT-Bench gets N/2 questions, two turns
#   each, so N answers), TOKENS (default 64), FLOW, DFLASH, DFLASH2 (checkpoint dirs, default the committed
#   ones; DFLASH2= empty skips its rows), TARGET (`flashmap bench --target`, default qwen2.5-coder-0.5b),
#   TREES (tree sizes beside each chain, default 16,32; TREES= empty: chains only, about half the time),
#   SPREAD=1 (`flashmap bench --spread`: MT-Bench's questions round-robin over its eight categories, not the
#   first N/2, which are all writing).
# Exit status 1 when a run failed (the others still run; a rerun repeats only the failed ones).
# Output: $OUT/T<t>/<drafter>-<dataset>/results.{json,md}, $OUT/T<t>/rows.md (γ of every row per set),
#   $OUT/T<t>/compare-*.md (paired Δγ).
set -euo pipefail

FLOW=${FLOW:-checkpoints/flashmap-flow-qwen3-qwen2.5-coder-0.5b}
DFLASH=${DFLASH:-checkpoints/dflash-qwen2.5-coder-0.5b}
DFLASH2=${DFLASH2-checkpoints/dflash2-qwen2.5-coder-0.5b}
OUT=${OUT:-runs/compare}; CORES=${CORES:-0}; TEMPS=${TEMPS:-0,1}
DATASETS=${DATASETS:-gsm8k,humaneval,mtbench}; N=${N:-16}; TOKENS=${TOKENS:-64}
TARGET=${TARGET:-qwen2.5-coder-0.5b}; TREES=${TREES-16,32}
FM=.venv/bin/flashmap

rows() {  # drafter -> its bench flags and rows: the chain, then one tree per size in TREES
    local flags methods tree n
    case $1 in
        flow) flags="--drafter $FLOW"; methods=FlashMap-1; tree="FlashMap-1 top-k" ;;
        dflash) flags="--dflash $DFLASH"; methods=DFlash; tree="DFlash top-k" ;;
        dflash2) flags="--dflash $DFLASH2"; methods=DFlash2; tree="DFlash2 selector" ;;
    esac
    for n in ${TREES//,/ }; do methods="$methods,$tree $n"; done
    echo "$flags --methods $methods"
}

jobs() {  # one line per run: temperature drafter dataset
    local drafters="flow dflash"; [ -n "$DFLASH2" ] && drafters="$drafters dflash2"
    local t d s
    for t in ${TEMPS//,/ }; do for s in ${DATASETS//,/ }; do for d in $drafters; do echo "$t $d $s"; done; done; done
}

one_run() {  # temperature drafter dataset
    local t=$1 d=$2 s=$3 out="$OUT/T$1/$2-$3" n=$N flags
    [ "$s" = mtbench ] && n=$(( N / 2 ))
    if [ -s "$out/results.json" ] && grep -q '"finished"' "$out/results.json"; then return; fi
    flags=$(rows "$d")
    echo "=== $(date -u +%H:%M:%S) T=$t $d $s (core $(taskset -cp $BASHPID | awk '{print $NF}'))"
    # --methods carries spaces inside its list: split the flags at the first ' --methods '
    $FM bench --target "$TARGET" ${flags%% --methods *} --methods "${flags#* --methods }" --datasets "$s" --n "$n" \
        --max-new-tokens "$TOKENS" --temperature "$t" --seed 0 --dtype fp32 --threads 1 --no-peers \
        --shuffle-n 0 --shapes ${SPREAD:+--spread} --out "$out"
}

worker() {  # index of CORES: runs every W-th job, pinned to its core; status 1 when one of them failed
    local i=$1 core=$2 w=$3 k=0 failed=0
    taskset -cp "$core" $BASHPID > /dev/null
    while read -r t d s; do
        if [ $(( k % w )) -eq "$i" ]; then
            one_run "$t" "$d" "$s" || { echo "run T=$t $d $s failed" >&2; failed=1; }
        fi
        k=$(( k + 1 ))
    done < <(jobs)
    return $failed
}

compare() {  # per temperature: every row's γ, and paired Δγ of the drafters' rows (prompts paired by id)
    local t files pair
    for t in ${TEMPS//,/ }; do
        files=$(ls "$OUT/T$t"/*/results.json 2>/dev/null) || continue
        $FM bench compare $files --rows > "$OUT/T$t/rows.md" 2>&1 || true
        for pair in "DFlash,FlashMap-1" "DFlash2,DFlash" "DFlash2 selector 32,DFlash2" "DFlash top-k 32,DFlash" \
                    "FlashMap-1 top-k 32,FlashMap-1"; do
            $FM bench compare $files --pair "$pair" > "$OUT/T$t/compare-${pair//[ ,]/_}.md" 2>&1 || true
        done
    done
}

main() {
    cd "$(dirname "$0")/.."
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
    local cores=(${CORES//,/ }) i
    for d in "$FLOW" "$DFLASH" ${DFLASH2:+"$DFLASH2"}; do
        [ -s "$d/model.safetensors" ] \
            || { echo "recipes/compare_drafters.sh: $d/model.safetensors missing (make checkpoints)" >&2; exit 2; }
    done
    local pids=() failed=0 p
    for i in "${!cores[@]}"; do worker "$i" "${cores[$i]}" "${#cores[@]}" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    compare
    if [ "$failed" = 1 ]; then
        echo "recipes/compare_drafters.sh: some runs failed (above); rerun to repeat them" >&2; exit 1
    fi
    echo "done: $OUT"
}

[ "${BASH_SOURCE[0]}" != "$0" ] || main "$@"   # sourced (tests): functions only
