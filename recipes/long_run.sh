#!/usr/bin/env bash
# One resumable piece of a long training run: warm-start a drafter from its committed
# checkpoint, train PIECE_STEPS more steps on the whole corpus, evaluate it and the committed one on the
# held-out set, and say whether the piece beats the committed weights (only then is it committed, by hand:
# checkpoints/README.md "Adding a checkpoint"). Every stage is skipped when its output exists and training
# resumes from its newest checkpoint, so rerunning the same command after an interruption loses nothing.
#
#   CORE=1 recipes/long_run.sh dflash          # features (if missing), vocab, train, eval, curve line
#   CORE=1 recipes/long_run.sh flow            # the FlashMap flow model (then `map` on its output)
#   CORE=1 recipes/long_run.sh dflash2         # DFlash2 warm-started from the committed DFlash2 (where there is
#                                              # none, from the committed DFlash: its convolutions start as
#                                              # identities, its selector fresh): DFlash's recipe + group 32,
#                                              # rank 32, top-16; judged against the checkpoint it started from
#   CORE=1 recipes/long_run.sh map             # distil RUN/flow/drafter into a 1-2 step map (fresh student:
#                                              # the teacher's Euler step; PIECE_STEPS defaults to 2/5 of the
#                                              # flow piece's, LR to 8e-5, --frac-01 0: without 0->1 jumps, the stable
#                                              # setting on this target, docs/bench/heldout-eval/map-distillation/)
#
# Knobs (env): RUN (work dir, default runs/long), CORE (the core the piece is pinned to, default 1),
#   PIECE_STEPS (default 4000), LR (peak, default 6e-4), WARMUP (default 0.04), DTYPE (target dtype; default
#   bench.machine.auto_dtype), PER_DOMAIN (held-out sequences per domain, default 8), EXTRA (more flags for
#   `flashmap train`, e.g. the state/clock design's), LAYERS (a size arm: the drafter gets LAYERS layers instead
#   of the committed 2, those 2 copied into the first ones and the added ones starting as the identity,
#   `--add-layers`; give the arm its own RUN, and PIECE_STEPS for the same CPU time as the 2-layer piece),
#   FROM (another run's folder whose piece of this kind beat but is not committed yet: warm-start from
#   FROM/<kind>/drafter instead of the committed checkpoint, judge the piece against it, and count the steps and
#   core-hours on from its curve line, so pieces chain before one of them is committed).
# Progress: $RUN/<kind>/metrics.jsonl (step, loss, ...) and $RUN/<kind>.log; `tail -f` either.
# Output: $RUN/eval-<kind>/eval.{json,md,png} and one JSON line appended to $RUN/curve-<kind>.jsonl with the
#   cumulative steps and core-hours of the piece added to the committed weights' own (docs/bench/long-run/history.json).
set -euo pipefail

main() {
    cd "$(dirname "$0")/.."
    local kind=${1:?usage: recipes/long_run.sh dflash|dflash2|flow|map}
    RUN=${RUN:-runs/long}; CORE=${CORE:-1}; PER_DOMAIN=${PER_DOMAIN:-8}; WARMUP=${WARMUP:-0.04}
    if [ "$kind" = map ]; then PIECE_STEPS=${PIECE_STEPS:-$(( $(flow_piece_steps) * 2 / 5 ))}; LR=${LR:-8e-5}
    else PIECE_STEPS=${PIECE_STEPS:-4000}; LR=${LR:-6e-4}; fi
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
    taskset -cp "$CORE" $$ > /dev/null   # this shell and everything it starts run on CORE
    raise_priority
    PY=".venv/bin/python"; FM=".venv/bin/flashmap"
    mkdir -p "$RUN"
    case $kind in
        dflash) INIT=checkpoints/dflash-qwen2.5-coder-0.5b ;;
        dflash2) INIT=checkpoints/dflash2-qwen2.5-coder-0.5b
                 [ -s "$INIT/model.safetensors" ] || INIT=checkpoints/dflash-qwen2.5-coder-0.5b ;;
        flow) INIT=checkpoints/flashmap-flow-qwen2.5-coder-0.5b ;;
        map) INIT=checkpoints/flashmap-map-qwen2.5-coder-0.5b
             [ -s "$RUN/flow/drafter/model.safetensors" ] \
                 || { echo "recipes/long_run.sh map: teacher $RUN/flow/drafter missing: run the flow piece first" >&2; exit 2; } ;;
        *) echo "recipes/long_run.sh: kind: expected dflash, dflash2, flow or map, got '$kind'" >&2; exit 2 ;;
    esac
    [ -s "$INIT/model.safetensors" ] || { echo "$INIT/model.safetensors missing: run 'make checkpoints'" >&2; exit 2; }
    PAST=""; [ -z "${FROM:-}" ] || from_piece "$kind"
    RUN=$RUN FEATURE_JOBS=1 THREADS=1 DTYPE=${DTYPE:-} recipes/train_real_drafters.sh features
    vocab_of "$INIT" "$RUN/vocab-$kind.json"
    local t0 c0; t0=$(date +%s); cpu_now; c0=$CPU_S
    "train_$kind" 2>&1 | tee -a "$RUN/$kind.log"
    cpu_now
    echo "{\"kind\": \"$kind\", \"piece_steps\": $PIECE_STEPS, \"wall_s\": $(( $(date +%s) - t0 )),\
 \"cpu_s\": $(( CPU_S - c0 )), \"warm_start\": $([ "$kind" = map ] && echo false || echo true),\
 \"history_kind\": \"$(history_kind "$kind")\", \"batch_size\": 2, \"sequences\": $(sequences)$PAST}" \
        > "$RUN/$kind.piece.json"
    $FM eval --drafter "piece=$RUN/$kind/drafter" --drafter "committed=$INIT" --per-domain "$PER_DOMAIN" \
        --threads 1 --out "$RUN/eval-$kind" ${DTYPE:+--dtype "$DTYPE"}
    $FM eval verdict "$RUN" "$kind" "$INIT" --history docs/bench/long-run/history.json
}

# A pinned piece keeps its core against other work on it (other jobs, tests): this shell and all it starts run at
# nice PIECE_NICE (default -10; root only, left as is elsewhere), and where the kernel shares the CPU between
# autogroups before it looks at nice values (sched_autogroup_enabled = 1) the login shell's autogroup gets it too.
raise_priority() {
    local want=${PIECE_NICE:--10}
    renice -n "$want" -p $$ > /dev/null 2>&1 && echo "long_run: nice $want" \
        || echo "long_run: nice left as is (not permitted here, or PIECE_NICE is not in -20..19)"
    if [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ]; then
        echo "$want" 2> /dev/null > /proc/$$/autogroup && echo "long_run: autogroup nice $want" || true
    fi
}

# CPU seconds (user + sys) of this shell's finished children: the training's own core time, which is the
# budget even when the pinned core is shared (wall time then overstates it). A resumed piece counts only
# what ran in this invocation; the piece record is rewritten by the run that finishes it.
cpu_now() {  # sets CPU_S; `times` runs in this shell (in a $(...) subshell it would read 0)
    local f; f=$(mktemp); times > "$f"
    CPU_S=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] }
                           printf "%d\n", s }' "$f"); rm -f "$f"
}

# The committed checkpoint's draft vocabulary (target ids = row + d2t[row]) as --draft-vocab's JSON.
vocab_of() {
    [ -s "$2" ] && return
    $PY - "$1" "$2" <<'EOF'
import json, sys
import torch
from safetensors.torch import load_file
d2t = load_file(f"{sys.argv[1]}/model.safetensors")["d2t"]
ids = (torch.arange(d2t.numel()) + d2t).tolist()
json.dump({"size": len(ids), "ids": ids, "source": sys.argv[1]}, open(sys.argv[2], "w"))
print(f"draft vocabulary: {len(ids)} ids from {sys.argv[1]}")
EOF
}

COMMON() {
    local target dtype
    target=$($PY -c 'from flashmap_ext.assets.models import qwen05_dir; print(qwen05_dir())')
    dtype=${DTYPE:-$($PY -c 'from flashmap_ext.bench.machine import auto_dtype; print(auto_dtype())')}
    echo --target "$target" --features "$RUN/features" --preset cpu-small --target-dtype "$dtype" \
        --batch-size 2 --accum 1 --num-anchors 32 --max-length 384 --save-every 100 --log-every 10 \
        --no-progress --device cpu --seed 1 --steps "$PIECE_STEPS" --lr "$LR" --warmup "$WARMUP" \
        --draft-vocab "$RUN/vocab-$1.json" --tap-layers 1,6,11,16,21 --init-from "$INIT" --out "$RUN/$1"
}

# Training sequences in the features the pieces read (the curve's epochs = steps x batch / sequences).
sequences() {
    $PY -c 'import sys; from flashmap_ext.train.features import FeatureCache; print(len(FeatureCache(sys.argv[1])))' \
        "$RUN/features"
}

# The flow piece's steps (from its piece record, else the default), for the map's 2/5 rule.
flow_piece_steps() {
    if [ -s "$RUN/flow.piece.json" ]; then
        .venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["piece_steps"])' "$RUN/flow.piece.json"
    else echo 4000; fi
}

# FROM=: warm-start from FROM/<kind>/drafter, a piece that beat its start (the last line of FROM/curve-<kind>.jsonl
# says "beats"); sets INIT and PAST (that line's cumulative steps and core-hours, for the piece record).
from_piece() {
    [ "$1" != map ] || { echo "recipes/long_run.sh: FROM applies to dflash, dflash2 and flow, not map" >&2; exit 2; }
    INIT="$FROM/$1/drafter"
    [ -s "$INIT/model.safetensors" ] || { echo "recipes/long_run.sh: FROM: $INIT/model.safetensors missing" >&2; exit 2; }
    PAST=$($PY - "$FROM/curve-$1.jsonl" <<'EOF'
import json, sys
try:
    line = json.loads(open(sys.argv[1]).read().splitlines()[-1])
except (OSError, IndexError) as e:
    sys.exit(f"recipes/long_run.sh: FROM: no learning-curve line in {sys.argv[1]} ({e})")
if line["verdict"] != "beats":
    sys.exit(f"recipes/long_run.sh: FROM: its piece {line['verdict']} its start; continue from what it started from")
print(f', "past": {{"steps": {line["cumulative_steps"]}, "core_hours": {line["core_hours"]}}}')
EOF
) || exit 2
    echo "long_run: warm start from the uncommitted piece $INIT"
}

# Whose training history the piece continues: DFlash's for a DFlash2 started from the DFlash checkpoint.
history_kind() { [ "$1" = dflash2 ] && [ "$INIT" = checkpoints/dflash-qwen2.5-coder-0.5b ] && echo dflash || echo "$1"; }

layers() { echo --layers "${LAYERS:-2}"; [ "${LAYERS:-2}" -gt 2 ] && echo --add-layers || true; }

resume_flag() { [ -d "$1/checkpoints" ] && ls "$1/checkpoints" | grep -q . && echo --resume || true; }

# The committed recipe's shapes (recipes/train_real_drafters.sh), so the warm start fits.
train_dflash() {
    # shellcheck disable=SC2046
    $FM train dflash $(COMMON dflash) $(resume_flag "$RUN/dflash") $(layers) --block-size 9 \
        --intermediate-size 384 --mask-token-id 151665 ${EXTRA:-}
}
train_dflash2() {  # DFlash's shapes + the convolutions and selector of recipes/train_real_drafters.sh dflash2
    # shellcheck disable=SC2046
    $FM train dflash2 $(COMMON dflash2) $(resume_flag "$RUN/dflash2") $(layers) --block-size 9 \
        --intermediate-size 384 --mask-token-id 151665 --conv-group-size 32 --selector-rank 32 \
        --selector-top-k 16 ${EXTRA:-}
}
train_flow() {
    # shellcheck disable=SC2046
    $FM train flow $(COMMON flow) $(resume_flag "$RUN/flow") $(layers) --width 384 --heads 6 --block-size 8 \
        --tau0-frac 0.5 --no-head-recompute ${EXTRA:-}
}

# Distillation of this run's flow piece: a fresh student (the teacher's Euler step), not a warm start of the
# committed map (whose teacher was another flow model); the same features, batch and anchors as the others.
train_map() {
    local args
    args=$(COMMON map | sed -e "s| --init-from [^ ]*||" -e "s| --draft-vocab [^ ]*||" -e "s|--save-every 100|--save-every 20|")
    # shellcheck disable=SC2086
    $FM distill $args $(resume_flag "$RUN/map") --teacher "$RUN/flow/drafter" --frac-01 0 ${EXTRA:-}
}

main "$@"
