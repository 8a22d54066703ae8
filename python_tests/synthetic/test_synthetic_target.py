"""The synthetic target directory: tokenizer and chat template give back the language's ids, load_target loads it,
the true entropy is the mean of −log next_probs."""
from __future__ import annotations

import json
import math

import pytest
import torch

from flashmap_ext.synthetic.greedy import greedy_corpus
from flashmap_ext.synthetic.language import Language, LanguageSpec, Parser, sample_corpus
from flashmap_ext.synthetic.target import (
    TargetRecipe,
    build_model,
    conversation,
    load_spec,
    make_tokenizer,
    model_entropy,
    true_entropy,
)
from flashmap_ext.target.load import load_target
from flashmap_ext.train.data import render_conversation

LANG = Language(LanguageSpec())


def test_chat_rendering_gives_back_the_sequence():
    tok = make_tokenizer(LANG)
    for seq in sample_corpus(LANG, 5, seed=7):
        (sample,) = render_conversation(tok, conversation(LANG, seq)["messages"])
        assert sample.input_ids == seq
        assert sample.loss_mask == [0] * (LANG.spec.header + 1) + [1] * (len(seq) - LANG.spec.header - 1)


def test_greedy_records_render_with_the_answer_from_the_cut():
    tok = make_tokenizer(LANG)
    for seq, c in greedy_corpus(LANG, 5, seed=7):
        (sample,) = render_conversation(tok, conversation(LANG, seq, c)["messages"])
        assert sample.input_ids == seq
        assert sample.loss_mask == [0] * c + [1] * (len(seq) - c)


def test_saved_directory_loads_as_a_target(tmp_path):
    model = build_model(LANG, TargetRecipe(layers=1, hidden=16, heads=2)).eval()
    model.save_pretrained(tmp_path)
    make_tokenizer(LANG).save_pretrained(tmp_path)
    (tmp_path / "testbed.json").write_text(json.dumps({"spec": LanguageSpec().__dict__}))
    target, tok = load_target(str(tmp_path), device="cpu")
    assert load_spec(tmp_path) == LanguageSpec() and tok.eos_token_id == 1
    seqs = sample_corpus(LANG, 3, seed=0)
    ids = torch.tensor([seqs[0]])
    assert torch.allclose(target.model(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    assert model_entropy(model, LANG, seqs) == pytest.approx(math.log(256), rel=0.2)  # untrained: near uniform
    with pytest.raises(ValueError, match="--target"):
        load_spec(tmp_path / "missing")


def test_true_entropy_is_the_mean_negative_log_probability():
    seqs = sample_corpus(LANG, 4, seed=5)
    terms = []
    for s in seqs:
        parser = Parser(LANG, s)
        terms += [-math.log(parser.probs(parser.states[t - 1])[s[t]]) for t in range(LANG.spec.header + 1, len(s))]
    assert true_entropy(LANG, seqs) == pytest.approx(sum(terms) / len(terms), rel=1e-12)
