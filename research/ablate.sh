#!/usr/bin/env bash
# Ablations at equal budget on one CPU core: one feature cache of a fixed subset of the committed
# train corpus, one draft vocabulary, then one arm after another (train, then `flashmap eval` on the fixed
# held-out set). Resumable: a finished stage or arm (its eval/eval.json exists) is skipped, an arm whose
# training stopped resumes from its newest checkpoint. `flashmap eval ablation RUN` makes the table.
#
#   nohup taskset -c 1 research/ablate.sh > runs/ablate.log 2>&1 &
#   research/ablate.sh subset features vocab flow dflash      # only the named stages / arms
#
# Arms (the shared settings are recipes/train_real_drafters.sh's, --no-head-recompute everywhere: the same
# gradients, less compute on a CPU):
#   flow            FlashMap flow model as in the recipe (slot decay 7, τ = 0 for half the blocks, K = 8)
#   dflash          DFlash baseline as in the recipe (block 9 = anchor + 8)
#   flow-auto-tau1  flow + --slot-decay auto (3.73 at K = 8) + --tau0-frac 1.0 (every block at τ = 0)
#   flow-tapnorm    flow + --tap-input-norm (RMSNorm of each tap before the projection)
#   flow-k5         flow at block size 5
#   flow-auto, flow-tau1   one of flow-auto-tau1's two changes each; flow-tau0: no block at τ = 0 (FLM)
#   flow-v16k       flow with a 16,384-row draft vocabulary (stage vocab16k)
#   flow-tapnorm-auto-tau1 the three changes together
#   flow-full-state flow on FLM's clock of the V-dim state (--clock full-state)
#   flow-loglik     flow + --state-loglik (the state's exact log-likelihood added to the logits)
#   dflash-kl, flow-kl     --loss kl: forward KL to the target's top-TOPK distribution
#   dflash-klce, flow-klce --loss kl --kl-ce-weight 0.5 (plus half the CE of the target's argmax)
#   ARM-sN                 any arm with --seed N (data order, anchors, noise; a seed repeat)
# Knobs (env): RUN, N_CONV (first N_CONV train conversations by id), STEPS, THREADS, MAX_LEN, VOCAB, CORPUS,
#   HELDOUT_PER_DOMAIN, ARMS, TOPK (soft labels stored by the features stage; 0: none), BATCH, ANCHORS.
set -euo pipefail

main() {
    cd "$(dirname "$0")/.."
    RUN=${RUN:-runs/ablate}
    N_CONV=${N_CONV:-600}
    STEPS=${STEPS:-1000}
    THREADS=${THREADS:-1}
    MAX_LEN=${MAX_LEN:-384}
    VOCAB=${VOCAB:-8192}
    FM_TAPS=${FM_TAPS:-1,6,11,16,21}
    HELDOUT_PER_DOMAIN=${HELDOUT_PER_DOMAIN:-8}
    CORPUS=${CORPUS:-data/qwen2.5-coder-0.5b-instruct/train}
    ARMS=${ARMS:-flow dflash flow-auto-tau1 flow-tapnorm flow-k5}
    TOPK=${TOPK:-32}
    BATCH=${BATCH:-2}
    ANCHORS=${ANCHORS:-32}
    export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false
    PY=${PY:-.venv/bin/python}
    FM=("$PY" -m flashmap_ext.cli)
    mkdir -p "$RUN"
    TARGET=$($PY -c 'from flashmap_ext.assets.models import qwen05_dir; print(qwen05_dir())')
    DTYPE=${DTYPE:-$($PY -c 'from flashmap_ext.bench.machine import auto_dtype; print(auto_dtype())')}
    COMMON=(--target "$TARGET" --features "$RUN/features" --preset cpu-small --target-dtype "$DTYPE"
            --batch-size "$BATCH" --accum 1 --num-anchors "$ANCHORS" --max-length "$MAX_LEN" --save-every 100 --log-every 10
            --no-progress --device cpu --seed 0 --steps "$STEPS" --lr 1e-3 --warmup 0.05
            --draft-vocab "$RUN/draft_vocab.json" --tap-layers "$FM_TAPS")
    local todo=("$@")
    [ ${#todo[@]} -eq 0 ] && todo=(subset features vocab $ARMS)
    for stage in "${todo[@]}"; do
        local t0; t0=$(date +%s)
        echo "=== $stage ($(date -u +%H:%M:%S))"
        case $stage in
            subset|features|vocab|vocab16k) "stage_$stage" ;;
            *) run_arm "$stage" || echo "=== $stage FAILED (next arm)" ;;
        esac
        echo "=== $stage done in $(( $(date +%s) - t0 )) s" | tee -a "$RUN/times.log"
    done
}

# The first N_CONV train conversations by id (ids are ShareGPT hashes: a domain mix like the corpus's).
stage_subset() {
    [ -s "$RUN/subset.jsonl" ] && { echo "skip: $RUN/subset.jsonl exists"; return; }
    $PY - "$CORPUS" "$N_CONV" "$RUN" <<'EOF'
import collections, json, sys
from flashmap_ext.train.store import read_records
corpus, n, run = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = sorted(read_records(corpus), key=lambda r: r["id"])[:n]
with open(f"{run}/subset.jsonl", "w") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
doms = collections.Counter(r["domain"] for r in rows)
info = {"corpus": corpus, "rule": f"first {n} records by id", "conversations": len(rows),
        "answer_tokens": sum(r["answer_tokens"] for r in rows), "domains": dict(doms),
        "first_id": rows[0]["id"], "last_id": rows[-1]["id"]}
json.dump(info, open(f"{run}/subset.json", "w"), indent=1)
print(info)
EOF
}

stage_features() {
    [ -e "$RUN/features.done" ] && { echo "skip: features done"; return; }
    "${FM[@]}" features --target "$TARGET" --data "$RUN/subset.jsonl" --out "$RUN/features" --max-length "$MAX_LEN" \
        --dtype bf16 --target-dtype "$DTYPE" --device cpu --no-progress --layers "$FM_TAPS" --topk "$TOPK"
    touch "$RUN/features.done"
}

# The VOCAB most frequent supervised ids of the whole committed train corpus (text only: training side,
# never the held-out split), ties by id.
stage_vocab() {
    local file=${RUN_VOCAB_FILE:-draft_vocab.json}
    [ -s "$RUN/$file" ] && { echo "skip: $RUN/$file exists"; return; }
    $PY - "$CORPUS" "$TARGET" "$VOCAB" "$MAX_LEN" "$RUN/$file" <<'EOF'
import json, sys
import torch
from transformers import AutoTokenizer
from flashmap_ext.train.data import load_samples
from flashmap_ext.train.eagle3 import build_draft_vocab
corpus, target, size, max_len, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tok = AutoTokenizer.from_pretrained(target)
V = json.load(open(f"{target}/config.json"))["vocab_size"]
counts = torch.zeros(V, dtype=torch.float64)
for s in load_samples(corpus, tok, max_length=max_len):
    ids = torch.tensor([i for i, m in zip(s.input_ids, s.loss_mask) if m], dtype=torch.long)
    counts += torch.bincount(ids, minlength=V)[:V].double()
ids = build_draft_vocab(counts, size)
cov = float(counts[ids].sum() / counts.sum())
json.dump({"size": size, "ids": ids.tolist(), "source": corpus, "train_tokens": int(counts.sum()),
           "coverage_train": cov}, open(out, "w"))
print(f"draft vocab {size}: {int(counts.sum())} supervised tokens of {corpus}, coverage {cov:.4f}")
EOF
}

stage_vocab16k() { [ -s "$RUN/draft_vocab16k.json" ] || VOCAB=16384 RUN_VOCAB_FILE=draft_vocab16k.json stage_vocab; }

resume_flag() { [ -d "$1/checkpoints" ] && ls "$1/checkpoints" | grep -q . && echo --resume || true; }

train_flow() {
    local dir=$1; shift
    "${FM[@]}" train flow "${COMMON[@]}" --out "$dir" $(resume_flag "$dir") --layers 2 --width 384 --heads 6 \
        --block-size 8 --tau0-frac 0.5 --no-head-recompute "$@"
}

train_dflash() {
    local dir=$1; shift
    "${FM[@]}" train dflash "${COMMON[@]}" --out "$dir" $(resume_flag "$dir") --layers 2 --block-size 9 \
        --intermediate-size 384 --mask-token-id 151665 "$@"
}

arm_flags() {
    if [[ $1 =~ ^(.+)-s([0-9]+)$ ]]; then  # a seed repeat of another arm
        echo "$(arm_flags "${BASH_REMATCH[1]}") --seed ${BASH_REMATCH[2]}"
        return
    fi
    case $1 in
        flow) echo "flow" ;;
        dflash) echo "dflash" ;;
        flow-auto-tau1) echo "flow --slot-decay auto --tau0-frac 1.0" ;;
        flow-tapnorm) echo "flow --tap-input-norm" ;;
        flow-k5) echo "flow --block-size 5" ;;
        flow-auto) echo "flow --slot-decay auto" ;;
        flow-tau1) echo "flow --tau0-frac 1.0" ;;
        flow-tau0) echo "flow --tau0-frac 0" ;;
        flow-v16k) echo "flow --draft-vocab $RUN/draft_vocab16k.json" ;;
        flow-tapnorm-auto-tau1) echo "flow --tap-input-norm --slot-decay auto --tau0-frac 1.0" ;;
        flow-full-state) echo "flow --clock full-state" ;;
        flow-loglik) echo "flow --state-loglik" ;;
        dflash-kl) echo "dflash --loss kl" ;;
        dflash-klce) echo "dflash --loss kl --kl-ce-weight 0.5" ;;
        flow-kl) echo "flow --loss kl" ;;
        flow-klce) echo "flow --loss kl --kl-ce-weight 0.5" ;;
        *) echo "unknown arm: $1" >&2; return 1 ;;
    esac
}

run_arm() {
    local arm=$1 dir=$RUN/$1
    [ -s "$dir/eval/eval.json" ] && { echo "skip: $dir/eval/eval.json exists"; return; }
    local flags kind; flags=$(arm_flags "$arm"); kind=${flags%% *}
    local extra=(); [ "$flags" != "$kind" ] && read -r -a extra <<< "${flags#* }"
    mkdir -p "$dir"
    local t0; t0=$(date +%s)
    if [ ! -s "$dir/drafter/model.safetensors" ]; then
        "train_$kind" "$dir" "${extra[@]}" || { echo "arm $arm: training failed"; return 1; }
        echo "$(( $(date +%s) - t0 ))" > "$dir/train_seconds"
    fi
    local spec="$arm=$dir/drafter"; [ "$kind" = flow ] && spec="$spec:1"
    "${FM[@]}" eval --per-domain "$HELDOUT_PER_DOMAIN" --threads "$THREADS" --drafter "$spec" --out "$dir/eval" \
        || { echo "arm $arm: eval failed"; return 1; }
    printf '{"arm": "%s", "kind": "%s", "flags": "%s", "steps": %s, "train_seconds": %s, "subset": "%s"}\n' \
        "$arm" "$kind" "${extra[*]}" "$STEPS" "$(cat "$dir/train_seconds" 2>/dev/null || echo null)" \
        "$RUN/subset.json" > "$dir/arm.json"
}

main "$@"
