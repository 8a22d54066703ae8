#!/usr/bin/env bash
# Re-measure a retrained FlashMap on the real target, one core, fp32.
#
#   research/remeasure_flashmap.sh MAP_DIR FLOW_DIR DFLASH_DIR [OUT]      # OUT default runs/remeasure
#
# 1. `flashmap bench` at T = 0 and at T = 1 (rows AR, FlashMap-1, FlashMap-2; DFlash too with ROWS=...,DFlash; no
#    HF peers), N prompts per dataset, TOKENS new tokens, the shuffle test on SHUFFLE_N (default N) prompts; then
#    flashmap bench compare: FlashMap-2 − FlashMap-1 Δγ and the shuffle Δγ (shared − per-slot noise), each with
#    its paired-bootstrap 95 % interval over prompts within datasets (bench/interval.py).
# 2. Held-out, teacher-forced as `flashmap eval` (flashmap eval compare, fp32): map 1 step vs its teacher flow
#    1 step, and map 2 steps vs map 1 step, with paired-bootstrap intervals over sequences within domains.
# Resumable: a finished stage (its output file exists) is skipped. Summary of what is done: OUT/summary.md.
# Knobs (env): DATASETS (gsm8k,mtbench), N (8), SHUFFLE_N (N), TOKENS (64), PER_DOMAIN (8), CORE (0), SEED (0),
#   ROWS (FlashMap-1,FlashMap-2), STAGES ("t0 t1 heldout": split them over two cores with two calls, e.g.
#   STAGES="t0 heldout" CORE=0 ... & STAGES=t1 CORE=1 ...; the last call's summary shows all finished stages).
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 MAP_DIR FLOW_DIR DFLASH_DIR [OUT]" >&2; exit 2; }
MAP=$(realpath "$1") FLOW=$(realpath "$2") DFLASH=$(realpath "$3") OUT=$(realpath -m "${4:-runs/remeasure}")
for d in "$MAP" "$FLOW" "$DFLASH"; do
    [ -s "$d/config.json" ] || { echo "$0: $d has no config.json (expected a drafter directory)" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
DATASETS=${DATASETS:-gsm8k,mtbench} N=${N:-8} TOKENS=${TOKENS:-64} PER_DOMAIN=${PER_DOMAIN:-8}
SHUFFLE_N=${SHUFFLE_N:-$N} CORE=${CORE:-0} SEED=${SEED:-0} ROWS=${ROWS:-FlashMap-1,FlashMap-2}
STAGES=${STAGES:-t0 t1 heldout}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
PIN=(taskset -c "$CORE")
mkdir -p "$OUT"

has() { [[ " $STAGES " == *" $1 "* ]]; }
for T in 0 1; do
    dir=$OUT/bench-t$T
    if has "t$T" && [ ! -s "$dir/results.json" ]; then
        echo "=== bench T = $T ($(date -u +%H:%M:%S))"
        "${PIN[@]}" "$PY" -m flashmap_ext.cli bench --drafter "$MAP" --dflash "$DFLASH" --methods "$ROWS" \
            --datasets "$DATASETS" --n "$N" --shuffle-n "$SHUFFLE_N" --max-new-tokens "$TOKENS" --temperature "$T" \
            --seed "$SEED" --dtype fp32 --threads 1 --no-peers --out "$dir"
    fi
    [ -s "$dir/results.json" ] && "$PY" -m flashmap_ext.cli bench compare "$dir/results.json" --out "$dir/delta.json" > "$dir/delta.md"
done

if has heldout && [ ! -s "$OUT/heldout.json" ]; then
    echo "=== held-out map vs teacher ($(date -u +%H:%M:%S))"
    "${PIN[@]}" "$PY" -m flashmap_ext.cli eval compare --dtype fp32 --threads 1 --per-domain "$PER_DOMAIN" \
        --drafter "map1=$MAP:1" --drafter "map2=$MAP:2" --drafter "teacher=$FLOW:1" \
        --pair map1,teacher --pair map2,map1 --out "$OUT/heldout.json" > "$OUT/heldout.md"
fi

{
    echo "# FlashMap re-measure: map $MAP, teacher $FLOW, DFlash $DFLASH"
    for T in 0 1; do
        [ -s "$OUT/bench-t$T/delta.md" ] && { echo; echo "## bench, T = $T"; echo; cat "$OUT/bench-t$T/delta.md"; }
    done
    [ -s "$OUT/heldout.md" ] && { echo; echo "## held-out (teacher-forced, fp32)"; echo; cat "$OUT/heldout.md"; }
    true
} > "$OUT/summary.md"
cat "$OUT/summary.md"
