"""A prompt + max_new_tokens beyond the target's context (max_position_embeddings) is refused before any
prefill, for the AR baseline, chain and tree drafting alike; exactly the context
fits. Tiny random target with 512 positions."""
import pytest

from conftest import tiny_qwen3
from flashmap_ext import Target, TreeSpec, generate
from support.drafter_doubles import OracleDrafter, OracleTreeDrafter


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def counting_target(model, monkeypatch):
    target, calls = Target(model), []
    forward = target.forward
    monkeypatch.setattr(target, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    return target, calls


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
@pytest.mark.parametrize("prompt_len, budget", [(500, 13), (512, 1), (600, 0)])
def test_beyond_the_context_is_refused_before_prefill(model, monkeypatch, kind, prompt_len, budget):
    target, calls = counting_target(model, monkeypatch)
    drafter = {"ar": None, "chain": OracleDrafter(model, 4), "tree": OracleTreeDrafter(model, 111)}[kind]
    tree = TreeSpec(3, 4, 8) if kind == "tree" else None
    want = (f"input_ids: prompt too long: {prompt_len} tokens exceed" if prompt_len > 512 else
            f"max_new_tokens: {budget} new tokens after a {prompt_len}-token prompt exceed")
    with pytest.raises(ValueError, match=want + " the target's context of 512 positions"):
        generate(target, drafter, [1] * prompt_len, budget, tree=tree)
    assert calls == []  # no prefill, no round


def test_exactly_the_context_fits(model, monkeypatch):
    target, calls = counting_target(model, monkeypatch)
    out = generate(target, OracleDrafter(model, 4), [1] * 500, 12)
    assert len(out.tokens) == 12 and calls
