#!/usr/bin/env bash
# Grow the self-answered corpus in data/: the fixed held-out set first (PER_DOMAIN prompts of each
# of math / code / chat), then training prompts until stopped. Resumable: rerun to continue where it stopped.
#
#   nohup taskset -c 1 recipes/grow_corpus.sh > runs/grow_corpus.log 2>&1 &
#
# Knobs (env): TARGET, OUT (corpus root), PER_DOMAIN (held-out prompts per domain), MAX_NEW, BATCH, THREADS,
#   LIMIT (training prompts this run; empty = all).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${TARGET:-qwen2.5-coder-0.5b}
OUT=${OUT:-data/qwen2.5-coder-0.5b-instruct}
PER_DOMAIN=${PER_DOMAIN:-24}
MAX_NEW=${MAX_NEW:-256}
BATCH=${BATCH:-48}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false
FM=(.venv/bin/python -m flashmap_ext.cli data generate --target "$TARGET" --max-new-tokens "$MAX_NEW"
    --batch-size "$BATCH" --threads "$THREADS")
"${FM[@]}" --out "$OUT/heldout" --split heldout --per-domain "$PER_DOMAIN"
"${FM[@]}" --out "$OUT/train" --split train ${LIMIT:+--limit "$LIMIT"}
