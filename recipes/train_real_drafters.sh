#!/usr/bin/env bash
# Train the committed drafters for the real offline target Qwen2.5-Coder-0.5B-Instruct on a CPU
# (DESIGN.md §8, §9). Every stage is resumable: it is skipped when its output exists,
# and training stages resume from their newest checkpoint. Logs and intermediate files go to runs/real/.
#
#   recipes/train_real_drafters.sh                 # every stage, in order
#   recipes/train_real_drafters.sh regen features  # only the named stages
#
# Stages: data regen features vocab flow distill dflash eagle3 export (and dflash2, run only when named)
# Knobs (env): N_REGEN, N_ORIG (training conversations), MAX_LEN, N_HELDOUT, MAX_NEW (tokens per regenerated answer),
#   STEPS (flow = dflash steps), DISTILL_STEPS (default 2/5 of STEPS), DISTILL_LR, CLOCK, THREADS, RUN (work dir), DTYPE (target dtype; default
#   bench.machine.auto_dtype: bf16 only with avx512_bf16/amx or a GPU, else fp32, 4-8x faster on AVX2),
#   CORPUS (the committed self-answered corpus that regen grows and features read; data/README.md),
#   FEATURE_JOBS (features: this many target processes at once, one per core, one per corpus part),
#   FEATURE_BATCH_TOKENS (features: padded tokens per batched prefill; 1: one sequence at a time),
#   TOPK (features: also store the target's top-TOPK log-probs per position, the soft labels of --loss kl; 0: none).
#
# Recipe (fair comparison: same data, same steps, same batch/anchors, ~same trainable parameters):
#   FlashMap: DiT 2 layers, width 384, 6 heads, cond 256, K = 8 slots, draft vocabulary 8,192 rows
#   DFlash:   2 Qwen3-style layers (hidden 896 = target's), intermediate 384, block 9 (anchor + 8 drafts),
#             the same 8,192-row draft vocabulary (9.75 M vs 9.72 M trainable parameters)
# K = 8: on this CPU a bf16 verify of 17 tokens costs ~1.33x one token (DESIGN.md §9), 9 tokens less; a
# drafter trained for minutes on ~10^5 tokens accepts few tokens past slot 5, so slots 9-16 would cost
# training compute (per-anchor labels, LM-head rows) and draft time and buy almost nothing.
set -euo pipefail

main() {
    cd "$(dirname "$0")/.."
    local root; root=$(pwd)
    RUN=${RUN:-runs/real}
    N_REGEN=${N_REGEN:-2000}
    REGEN_LIMIT=${REGEN_LIMIT:-576}  # of the N_REGEN short prompts, answer this many (18 batches: ~33 min here)
    REGEN_BATCH=${REGEN_BATCH:-32}  # conversations per batched generate (~70-90 tok/s at 16-48 on 2 quiet cores)
    N_ORIG=${N_ORIG:-0}
    N_HELDOUT=${N_HELDOUT:-12}
    MAX_NEW=${MAX_NEW:-192}
    MAX_LEN=${MAX_LEN:-384}
    STEPS=${STEPS:-3000}
    DISTILL_STEPS=${DISTILL_STEPS:-$(( STEPS * 2 / 5 ))}  # proportional to the flow's (1,200 at 3,000)
    FLOW_LR=${FLOW_LR:-1e-3}
    DISTILL_LR=${DISTILL_LR:-8e-5}     # ~1/12 of the flow's LR, as FMLM
    THREADS=${THREADS:-2}
    VOCAB=${VOCAB:-8192}
    TAU0_FRAC=${TAU0_FRAC:-0.5}        # flow: share of blocks trained at tau = 0, what 1-step drafting sees
    FRAC_01=${FRAC_01:-0}              # distill: share of 0->1 jumps (FMLM: 1/16; 0 here: 1/16 collapsed the
                                       # map at LR 8e-5, docs/bench/heldout-eval/map-distillation/)
    CLOCK=${CLOCK:-projected}          # flow: tau clock of the network's d-dim input; full-state = FLM's
    FM_TAPS=${FM_TAPS:-1,6,11,16,21}   # FlashMap and DFlash: 5 layers spread over 1..L-3 (L = 24)
    E3_TAPS=${E3_TAPS:-1,11,20}        # EAGLE-3: low/mid/high = eagle3_layer_ids(24)
    E3_INTERMEDIATE=${E3_INTERMEDIATE:-1664}  # EAGLE-3 MLP width: 9.75 M trainable parameters like the others
    CORPUS=${CORPUS:-data/qwen2.5-coder-0.5b-instruct/train}
    export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=false
    PY="nice -n 5 ${root}/.venv/bin/python"
    FM="nice -n 5 ${root}/.venv/bin/flashmap"
    mkdir -p "$RUN"

    local stages=("$@")
    [ ${#stages[@]} -eq 0 ] && stages=(data regen features vocab flow distill dflash eagle3 export)

    TARGET=$($PY -c 'from flashmap_ext.assets.models import qwen05_dir; print(qwen05_dir())')
    DTYPE=${DTYPE:-$($PY -c 'from flashmap_ext.bench.machine import auto_dtype; print(auto_dtype())')}
    echo "target: $TARGET ($DTYPE)"

    # shared optimisation settings of every stage (flow and dflash get the same; distill its own steps/lr)
    COMMON=(--target "$TARGET" --features "$RUN/features" --preset cpu-small --target-dtype "$DTYPE"
            --batch-size 2 --accum 1 --num-anchors 32 --max-length "$MAX_LEN" --save-every 100 --log-every 10
            --no-progress --device cpu --seed 0)

    for stage in "${stages[@]}"; do
        local t0; t0=$(date +%s)
        echo "=== stage $stage ($(date -u +%H:%M:%S))"
        "stage_$stage"
        echo "=== stage $stage done in $(( $(date +%s) - t0 )) s" | tee -a "$RUN/times.log"
    done
}

# 1. ShareGPT conversations, benchmark-decontaminated (13-gram rule), first user turn only. Three disjoint
#    sets: N_REGEN short prompts (prompts.jsonl, kept for reference: regen now answers the packaged train
#    split into CORPUS), N_ORIG conversations kept with
#    their original ShareGPT answers (orig.jsonl; target decoding on this CPU runs ~20 tok/s, so
#    self-answers are the scarce part), N_HELDOUT held out for the acceptance check.
stage_data() {
    [ -s "$RUN/prompts.jsonl" ] && { echo "skip: $RUN/prompts.jsonl exists"; return; }
    $PY -m flashmap_ext.assets.sharegpt "$RUN/sharegpt.jsonl" --limit 4000 --max-turns 1
    $PY - "$RUN" "$N_REGEN" "$N_ORIG" "$N_HELDOUT" <<'EOF2'
import json, sys
run, nr, no, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(f"{run}/sharegpt.jsonl")]
ok = [r for r in rows if r["messages"][0]["role"] == "user" and 20 <= len(r["messages"][0]["content"]) <= 1200]
short = [r for r in ok if len(r["messages"][0]["content"]) <= 600]
regen, held = short[:nr], short[nr:nr + h]
used = {r["id"] for r in regen + held}
orig = [r for r in ok if r["id"] not in used][:no]
for name, part in (("prompts", regen), ("heldout", held), ("orig", orig)):
    with open(f"{run}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
print(f"{len(rows)} conversations, {len(ok)} usable: {nr} regenerated, {no} original answers, {h} held out")
EOF2
}

# 2. Answers by the target itself (greedy, DTYPE, refill batches) appended to the committed corpus CORPUS
#    (train split of the packaged prompts; held-out prompts never enter it): what the target says is what
#    drafters predict. The corpus only grows; REGEN_LIMIT new answers per run (0: use the corpus as is).
stage_regen() {
    [ "$REGEN_LIMIT" -gt 0 ] || { echo "skip: REGEN_LIMIT=0"; return; }
    $FM data generate --target "$TARGET" --out "$CORPUS" --split train --batch-size "$REGEN_BATCH" \
        --max-new-tokens "$MAX_NEW" --limit "$REGEN_LIMIT" --dtype "$DTYPE" --no-progress
}

# 3. Target taps (5 layers spread over 1..L-3 = 1,6,11,16,21, plus EAGLE-3's 20), DTYPE target forward in
#    length-sorted batches of FEATURE_BATCH_TOKENS padded tokens, bf16 shards, one cache for every drafter.
#    The taps live in the feature store under the asset cache (train/feature_store.py: one cache per corpus
#    part, keyed by the part, the target, the taps and the settings; a part that grew is extended with its
#    new sequences only), and $RUN/features is a link to the store's view of CORPUS: computed once for every
#    work tree. FEATURE_JOBS > 1: one `flashmap features --store` per corpus part, FEATURE_JOBS at a time
#    pinned to cores 0,1,... (one thread each), then one over CORPUS that only links the view. Rerun after
#    the corpus grows: only the new sequences are computed. N_ORIG > 0 (original ShareGPT answers) adds
#    orig.jsonl, which is not a corpus part: then the cache is a plain folder in $RUN/features as before.
stage_features() {
    if [ -s "$RUN/orig.jsonl" ]; then
        [ -e "$RUN/features.done" ] && { echo "skip: $RUN/features done"; return; }
        features_of "$CORPUS" "$RUN/features" && features_of "$RUN/orig.jsonl" "$RUN/features"
        touch "$RUN/features.done"
        return
    fi
    if [ "${FEATURE_JOBS:-1}" -gt 1 ]; then
        local i=0 part
        mkdir -p "$RUN/feature-parts"
        for part in "$CORPUS"/part-*.jsonl.gz; do
            local link; link="$RUN/feature-parts/$(basename "$part" .jsonl.gz)"
            ( taskset -cp $(( i % FEATURE_JOBS )) $BASHPID > /dev/null
              OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 features_of "$part" "$link" --store ) > "$link.log" 2>&1 &
            i=$(( i + 1 ))
            [ $(( i % FEATURE_JOBS )) -eq 0 ] && wait
        done
        wait
    fi
    features_of "$CORPUS" "$RUN/features" --store
}
features_of() {  # corpus part or folder -> cache dir (or, with --store, a link to the store's view)
    mkdir -p "$(dirname "$2")"
    $FM features --target "$TARGET" --data "$1" --out "$2" --max-length "$MAX_LEN" --dtype bf16 \
        --target-dtype "$DTYPE" --device cpu --no-progress --layers "$(taps_union)" --topk "${TOPK:-0}" \
        --batch-tokens "${FEATURE_BATCH_TOKENS:-2048}" "${@:3}"
}

# one cache serves every drafter: the union of the FlashMap/DFlash and EAGLE-3 taps
taps_union() { echo "$FM_TAPS,$E3_TAPS" | tr , '\n' | sort -n | uniq | paste -sd, -; }

# 4. Draft vocabulary (every drafter drafts and trains on these LM-head rows only): the VOCAB most frequent
#    supervised (answer) ids of the feature cache, i.e. of the training corpus as cropped, ties by id.
stage_vocab() {
    [ -s "$RUN/draft_vocab.json" ] && { echo "skip: $RUN/draft_vocab.json exists"; return; }
    $PY - "$RUN" "$TARGET" "$VOCAB" <<'EOF'
import json, sys
import torch
from flashmap_ext.train.eagle3 import build_draft_vocab
from flashmap_ext.train.features import FeatureCache
run, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
V = json.load(open(f"{target}/config.json"))["vocab_size"]
cache = FeatureCache(f"{run}/features")
counts = torch.zeros(V, dtype=torch.float64)
for i in range(len(cache)):
    counts += torch.bincount(cache.supervised_tokens(i), minlength=V)[:V].double()
ids = build_draft_vocab(counts, size)
cov = float(counts[ids].sum() / counts.sum())
json.dump({"size": size, "ids": ids.tolist(), "source": f"{run}/features", "train_tokens": int(counts.sum()),
           "coverage_train": cov}, open(f"{run}/draft_vocab.json", "w"))
print(f"draft vocab {size}: {int(counts.sum())} supervised tokens, coverage {cov:.4f}")
EOF
}

resume_flag() { [ -d "$1/checkpoints" ] && ls "$1/checkpoints" | grep -q . && echo --resume || true; }

# 5. FlashMap flow model (the distillation teacher; also drafts by itself in one Euler step).
stage_flow() {
    [ -s "$RUN/flow/drafter/model.safetensors" ] && { echo "skip: flow drafter exists"; return; }
    $FM train flow "${COMMON[@]}" --out "$RUN/flow" $(resume_flag "$RUN/flow") --steps "$STEPS" --lr "$FLOW_LR" \
        --warmup 0.05 --layers 2 --width 384 --heads 6 --block-size 8 --draft-vocab "$RUN/draft_vocab.json" \
        --tap-layers "$FM_TAPS" --tau0-frac "$TAU0_FRAC" --no-head-recompute --clock "$CLOCK"
}

# 6. Semigroup flow-map distillation into a 1-2 step drafter.
stage_distill() {
    [ -s "$RUN/map/drafter/model.safetensors" ] && { echo "skip: distilled drafter exists"; return; }
    $FM distill "${COMMON[@]}" --out "$RUN/map" $(resume_flag "$RUN/map") --teacher "$RUN/flow/drafter" \
        --steps "$DISTILL_STEPS" --lr "$DISTILL_LR" --warmup 0.05 --save-every 20 --frac-01 "$FRAC_01"
}

# 7. DFlash baseline: same features, steps, batch and anchors; ~same trainable parameters.
stage_dflash() {
    [ -s "$RUN/dflash/drafter/model.safetensors" ] && { echo "skip: dflash drafter exists"; return; }
    $FM train dflash "${COMMON[@]}" --out "$RUN/dflash" $(resume_flag "$RUN/dflash") --steps "$STEPS" \
        --lr 1e-3 --warmup 0.05 --layers 2 --block-size 9 --intermediate-size 384 \
        --draft-vocab "$RUN/draft_vocab.json" --mask-token-id 151665 --tap-layers "$FM_TAPS"
}

# 7b. DFlash2 (not among the default stages: run `recipes/train_real_drafters.sh dflash2`): DFlash's recipe
#     above (same features, taps, steps, batch, anchors, LR, 2 layers, block 9, intermediate 384, draft
#     vocabulary) plus the dynamic convolutions (group 32) and the selector (rank 32, top-16): 10.72 M
#     trainable parameters, +9.9 % on DFlash's 9.75 M; loss = DFlash's + the selector's (weight 1).
stage_dflash2() {
    [ -s "$RUN/dflash2/drafter/model.safetensors" ] && { echo "skip: dflash2 drafter exists"; return; }
    $FM train dflash2 "${COMMON[@]}" --out "$RUN/dflash2" $(resume_flag "$RUN/dflash2") --steps "$STEPS" \
        --lr 1e-3 --warmup 0.05 --layers 2 --block-size 9 --intermediate-size 384 \
        --draft-vocab "$RUN/draft_vocab.json" --mask-token-id 151665 --tap-layers "$FM_TAPS" \
        --conv-group-size 32 --selector-rank 32 --selector-top-k 16
}

# 8. EAGLE-3 baseline: same features (its own low/mid/high taps), steps, batch, anchors and draft vocabulary;
#    one decoder layer at the target's width; its LM head frozen to the target's rows like the others'
#    (--frozen-lm-head) and its MLP sized so the trainable parameters match (9.75 M); chain of 8 drafts.
stage_eagle3() {
    [ -s "$RUN/eagle3/drafter/model.safetensors" ] && { echo "skip: eagle3 drafter exists"; return; }
    $FM train eagle3 "${COMMON[@]}" --out "$RUN/eagle3" $(resume_flag "$RUN/eagle3") --steps "$STEPS" \
        --lr 1e-3 --warmup 0.05 --draft-vocab "$RUN/draft_vocab.json" --tap-layers "$E3_TAPS" --frozen-lm-head \
        --intermediate-size "$E3_INTERMEDIATE" --draft-tokens 8 --ttt-steps 7
}

# 9. bf16 copies into checkpoints/ (config.json + model.safetensors, ≤ 24 MB each).
stage_export() {
    $PY - "$RUN" <<'EOF'
import json, os, sys
import torch
from safetensors.torch import load_file, save_file
run = sys.argv[1]
pairs = [("flow", "flashmap-flow-qwen2.5-coder-0.5b"), ("map", "flashmap-map-qwen2.5-coder-0.5b"),
         ("dflash", "dflash-qwen2.5-coder-0.5b"), ("eagle3", "eagle3-qwen2.5-coder-0.5b")]
for src, dst in pairs:
    s = f"{run}/{src}/drafter"
    if not os.path.exists(f"{s}/model.safetensors"):
        print(f"skip {dst}: {s} missing"); continue
    os.makedirs(f"checkpoints/{dst}", exist_ok=True)
    w = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in load_file(f"{s}/model.safetensors").items()}
    save_file(w, f"checkpoints/{dst}/model.safetensors", metadata={"format": "pt"})
    cfg = json.load(open(f"{s}/config.json"))
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = "bfloat16"
    json.dump(cfg, open(f"checkpoints/{dst}/config.json", "w"), indent=2)
    n = sum(v.numel() for k, v in w.items() if v.is_floating_point())
    print(f"{dst}: {n / 1e6:.2f} M params, {os.path.getsize(f'checkpoints/{dst}/model.safetensors') / 1e6:.1f} MB")
EOF
}

main "$@"
