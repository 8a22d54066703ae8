"""Tree speculative decoding (flashmap_ext/tree.py) and EAGLE-3 tree drafting, on tiny random targets."""
import math

import pytest
import torch
from scipy.stats import chi2

from conftest import tiny_qwen3
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.ops.verify_reference import verify_target_probs
from flashmap_ext.speculate import generate
from flashmap_ext.target import Target
from flashmap_ext.tree import TreeSpec, tree_accept, tree_attention_mask
from support.drafter_doubles import OracleTreeDrafter, greedy_continuation

V = 111


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(num_layers=6).requires_grad_(False)


def greedy(model, prompt, n):
    return greedy_continuation(model, prompt, n).tolist()


def test_tree_attention_mask_equals_each_path_alone(target):
    """Target.forward with the tree mask and depth positions: each node's logits == its path alone."""
    prompt, parents = [5, 17, 3], torch.tensor([-1, -1, 0, 0, 2, 1])
    tokens = torch.tensor([40, 41, 42, 43, 44, 45])
    depths = torch.tensor([1, 1, 2, 2, 3, 2])
    adapter = Target(target)
    cache = adapter.new_cache()
    adapter.forward(torch.tensor([prompt[:-1]]), cache)
    out = adapter.forward(torch.cat([torch.tensor([3]), tokens])[None], cache, num_logits=7,
                          attention_mask=tree_attention_mask(parents, 2, torch.float32),
                          position_ids=(2 + torch.cat([torch.zeros(1, dtype=torch.long), depths]))[None])
    for i in range(6):
        path, j = [], i
        while j >= 0:
            path, j = [int(tokens[j])] + path, int(parents[j])
        with torch.no_grad():
            alone = target(torch.tensor([prompt + path])).logits[0, -1]
        torch.testing.assert_close(out.logits[0, i + 1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("wrong_depth", [None, 1, 3])
def test_tree_greedy_equals_autoregressive_with_oracle_trees(target, wrong_depth):
    prompt, n = [5, 17, 3, 99], 14
    out = generate(target, OracleTreeDrafter(target, V, wrong_depth), prompt, n, tree=TreeSpec(depth=4))
    assert out.tokens == greedy(target, prompt, n)
    full = 4 if wrong_depth is None else wrong_depth - 1
    assert out.stats.accepted[:-1] == [full] * (len(out.stats.accepted) - 1)
    assert 1 + sum(out.stats.accepted) + out.stats.rounds == n  # 1: the prefill's first token


def test_tree_greedy_with_random_eagle3_drafter_and_stop(target):
    drafter = Eagle3Drafter.for_target(target, target_layer_ids=[1, 2, 4], num_draft_tokens=4)
    prompt = [5, 17, 3, 99]
    want = greedy(target, prompt, 12)
    assert generate(target, drafter, prompt, 12, tree=TreeSpec(3, 4, 6)).tokens == want
    stop = want[6]
    got = generate(target, drafter, prompt, 12, tree=TreeSpec(3, 4, 6), stop_token_ids=[stop]).tokens
    assert got == want[:want.index(stop) + 1]


def test_eagle3_draft_tree_scores_follow_the_chain(target):
    drafter = Eagle3Drafter.for_target(target, target_layer_ids=[1, 2, 4], num_draft_tokens=4)
    g = torch.Generator().manual_seed(0)
    ids, taps = torch.randint(0, V, (1, 9), generator=g), torch.randn(1, 9, 3 * 64, generator=g)
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids[:, :8], taps[:, :8])
    tree = drafter.draft_tree(memory, ids[0, 8:], torch.tensor([8]), depth=3, topk=3, num_nodes=9)
    assert tree.tokens.shape == (9,) and (tree.parents < torch.arange(9)).all()
    for i in range(9):
        path, j = [], i
        while j >= 0:
            path, j = [j] + path, int(tree.parents[j])
        forced = tree.tokens[path][None]
        logits, _ = drafter.chain(memory, ids[0, 8:], torch.tensor([8]), len(path), forced)
        rows = drafter.target_to_draft(forced[0])
        want = sum(torch.log_softmax(logits[0, s].float(), -1)[rows[s]].item() for s in range(len(path)))
        assert tree.scores[i].item() == pytest.approx(want, abs=1e-4)
        assert int(tree.depths[i]) == len(path)


def test_tree_accept_is_distribution_exact():
    """First token ~ p_root; given the first child accepted, the next token ~ p_child (chi-square)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, generator=g) * 1.5
    tokens, parents = torch.tensor([2, 0, 4]), torch.tensor([-1, -1, 0])  # node 2 (token 4) under node 0
    sampling = dict(temperature=0.9, top_k=0, top_p=1.0, valid_vocab=6)
    first, second = torch.zeros(6), torch.zeros(6)
    for seed in range(6000):
        path, bonus = tree_accept(logits, tokens, parents, 10, {**sampling, "seed": seed})
        emitted = tokens[path].tolist() + [bonus]
        first[emitted[0]] += 1
        if path[:1] == [0]:
            second[emitted[1]] += 1
    for counts, row in ((first, 0), (second, 1)):
        p = verify_target_probs(logits[row], 0.9, 0, 1.0, 6)
        stat = float(((counts - counts.sum() * p) ** 2 / (counts.sum() * p)).sum())
        assert stat < chi2.ppf(0.999, 5), (row, counts, p)
    assert math.isclose(second.sum() / 6000, verify_target_probs(logits[0], 0.9, 0, 1.0, 6)[2].item(), abs_tol=0.03)
