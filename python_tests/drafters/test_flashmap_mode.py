"""Mode-seeking FlashMap drafting (drafters/flashmap/mode.py): several noise draws, the drafter's best kept."""
import numpy as np
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import draft_block
from flashmap_ext.drafters.flashmap.mode import draft_best_of, draw_seed, own_acceptance
from flashmap_ext.speculate import generate
from support.drafter_doubles import greedy_continuation, random_flashmap
from support.loop_helpers import prompt_of

K, TAPS = 4, (1, 2)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def _memory(drafter, model, prompt):
    ids = torch.tensor([prompt])
    taps = model(ids, output_hidden_states=True).hidden_states
    memory = drafter.new_memory(1, "cpu")
    drafter.extend_memory(memory, ids[:, :-1], torch.cat([taps[i + 1][:, :-1] for i in TAPS], -1))
    return memory, ids[:, -1]


def _reference_score(logits: torch.Tensor) -> float:
    """Σ_j Π_{k≤j} max_v softmax(logits_k)_v, one row, a float64 loop."""
    total, run = 0.0, 1.0
    for row in logits.double().numpy():
        p = np.exp(row - row.max())
        run *= p.max() / p.sum()
        total += run
    return total


def test_own_acceptance_is_the_prefix_product_sum():
    logits = torch.randn(3, 5, 17) * 3
    got = own_acceptance(logits)
    for b in range(3):
        assert got[b].item() == pytest.approx(_reference_score(logits[b]), rel=1e-5)


def test_one_draw_is_the_plain_draft_and_more_draws_keep_the_best(model):
    drafter = random_flashmap(model, K, TAPS)
    memory, anchor = _memory(drafter, model, prompt_of(9))
    key = dict(seed=torch.tensor([5]), position=torch.tensor([8]))  # the anchor: prompt token 8
    plain = draft_block(drafter, memory, anchor, steps=1, **key).tokens
    assert torch.equal(draft_best_of(drafter, memory, anchor, draws=1, steps=1, **key), plain)
    blocks = [draft_block(drafter, memory, anchor, steps=1, seed=draw_seed(key["seed"], i), position=key["position"],
                          return_logits=True) for i in range(6)]
    scores = [_reference_score(b.logits[0]) for b in blocks]
    best = int(np.argmax(scores))
    assert len({tuple(b.tokens[0].tolist()) for b in blocks}) > 1, "fixture drifted: draws must differ"
    assert torch.equal(draft_best_of(drafter, memory, anchor, draws=6, steps=1, **key), blocks[best].tokens)


def test_draw_seeds_stay_in_range():
    top = 2**63 - 1
    assert draw_seed(top, 1) == 1_000_033 - 1
    assert draw_seed(torch.tensor([top, 3]), 2).tolist() == [2 * 1_000_033 - 1, 3 + 2 * 1_000_033]


@pytest.mark.parametrize("draws", [1, 3])
@pytest.mark.parametrize("prompt_len", [2, 17])
def test_greedy_identical_to_plain_greedy(model, draws, prompt_len):
    drafter = random_flashmap(model, K, TAPS)
    drafter.config.draft_draws = draws
    prompt = prompt_of(prompt_len)
    out = generate(model, drafter, prompt, 2 * K + 5)
    assert out.tokens == greedy_continuation(model, prompt, 2 * K + 5).tolist()


def test_bad_draws_name_the_argument(model):
    drafter = random_flashmap(model, K, TAPS)
    memory, anchor = _memory(drafter, model, prompt_of(5))
    with pytest.raises(ValueError, match="draws"):
        draft_best_of(drafter, memory, anchor, draws=0, seed=0, position=4)
