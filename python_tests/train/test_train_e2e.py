"""End to end: tiny target → its own greedy outputs → features → flow → distill → generate, and
the trained drafter's acceptance length on held-out prompts strictly beats a random drafter's.

The target is a random tiny Qwen3 over a word-level vocabulary (decode → encode round-trips exactly) with
a sharpened LM head, so its greedy continuations are deterministic structured text (runs and cycles)
that a drafter can learn from its hidden states. Runs in well under a minute on 2 cores.
"""
import json
import random

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap.config import default_tap_layers
from flashmap_ext.speculate import generate
from flashmap_ext.target import Target
from flashmap_ext.train.data import load_samples, prompt_ids
from flashmap_ext.train.distill import distill_loss, make_student
from flashmap_ext.train.features import FeatureCache, cache_features
from flashmap_ext.train.flow import flow_loss
from flashmap_ext.train.regenerate import regenerate
from flashmap_ext.train.runner import make_collate
from flashmap_ext.train.trainer import TrainConfig, train
from support.train_fixtures import qwen3_style_tokenizer

WORDS = [f"w{i}" for i in range(58)] + ["user", "assistant", "system"]
SHAPE = dict(n_layers=2, width=128, heads=4, block_size=8)
N_TRAIN, N_HELD = 64, 8


def tiny_word_target(tok):
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharp distributions: greedy outputs have structure
    return model


def write_prompts(path, n, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(WORDS[:58]) for _ in range(rng.randint(4, 10)))
            f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": words}]}) + "\n")


def acceptance_length(target, drafter, tok, records, max_new_tokens=32) -> float:
    """γ over all rounds of greedy speculative decoding of every held-out prompt (bonus included)."""
    committed = rounds = 0
    for r in records:
        out = generate(target, drafter.eval(), prompt_ids(tok, r["messages"][:-1]), max_new_tokens)
        committed += sum(out.stats.accepted) + out.stats.rounds
        rounds += out.stats.rounds
    return committed / rounds


def test_pipeline_trained_drafter_beats_random(tmp_path):
    tok = qwen3_style_tokenizer("word", WORDS)
    model = tiny_word_target(tok)
    target = Target(model)
    write_prompts(tmp_path / "prompts.jsonl", N_TRAIN + N_HELD)
    regenerate(model, tok, str(tmp_path / "prompts.jsonl"), str(tmp_path / "regen.jsonl"), batch_size=16,
               max_new_tokens=40, progress=False)
    records = [json.loads(line) for line in (tmp_path / "regen.jsonl").read_text().splitlines()]
    train_recs, held = records[:N_TRAIN], records[N_TRAIN:]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_recs))

    layers = list(default_tap_layers(model.config.num_hidden_layers))
    cache_features(model, load_samples(str(tmp_path / "train.jsonl"), tok), str(tmp_path / "feats"), layers,
                   progress=False)
    cache = FeatureCache(str(tmp_path / "feats"))
    assert len(cache) == N_TRAIN

    torch.manual_seed(1)
    flow = FlashMapDrafter.for_target(target, **SHAPE, two_time=False)
    collate_fn = make_collate(16, flow.num_draft_tokens, None, torch.float32)
    opt = dict(batch_size=8, save_every=0, progress=False, warmup=0.05)
    flow_metrics = train(flow, flow_loss, cache, collate_fn,
                         TrainConfig(out=str(tmp_path / "flow"), steps=120, lr=2e-3, **opt))
    student = make_student(flow.eval().requires_grad_(False))
    train(student, lambda m, b, g: distill_loss(m, flow, b, g), cache, collate_fn,
          TrainConfig(out=str(tmp_path / "map"), steps=40, lr=5e-4, **opt))
    student.save_pretrained(tmp_path / "drafter")
    trained = FlashMapDrafter.from_pretrained(tmp_path / "drafter", target)

    torch.manual_seed(2)
    rand = FlashMapDrafter.for_target(target, **SHAPE)
    rand.reset_parameters(zero_init=False)
    g_random = acceptance_length(target, rand, tok, held)
    g_trained = acceptance_length(target, trained, tok, held)
    assert flow_metrics["acc"] > 0.5, flow_metrics
    assert g_trained > g_random + 0.3, (g_trained, g_random)
