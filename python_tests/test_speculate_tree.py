"""Tree rounds through the public loop, `generate(..., tree=TreeSpec(depth, topk, num_nodes))`: the same
contract as the chain (DESIGN.md §7) on tiny random Qwen3 targets (CPU, no downloads).

References as in test_speculate.py: full-recompute greedy decoding at T = 0, the target's exact joint law
of the first 3 tokens at T > 0.
"""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import Eagle3Drafter, Target, TreeSpec, generate
from support.drafter_doubles import OracleTreeDrafter, RandomDrafter, greedy_continuation
from support.loop_helpers import V_SMALL, assert_matches_joint, nan_block_logits, prompt_of

V, NEW = 111, 13
SMALL = TreeSpec(depth=3, topk=4, num_nodes=8)
STOP_PROMPT = [79, 0, 94, 5, 29, 11]  # its greedy continuation starts with 10 distinct tokens


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def eagle3(model, kind: str = "random"):
    """A random EAGLE-3 drafter (LM head = the target's, the rest random) tapping layers 0, 1 and the last.

    kind "echo": attention and MLP outputs zeroed and `fc` passing the last layer's tap through, so every
    node's draft logits are the target's logits at the position before the anchor (it proposes the top-k
    of the anchor's own distribution at every depth): deep paths are accepted on repetitive text."""
    torch.manual_seed(1)
    last = model.config.num_hidden_layers - 1
    drafter = Eagle3Drafter.for_target(model, target_layer_ids=[0, 1, last], num_draft_tokens=4)
    if kind == "echo":
        d = model.config.hidden_size
        with torch.no_grad():
            drafter.midlayer.self_attn.o_proj.weight.zero_()
            drafter.midlayer.mlp.down_proj.weight.zero_()
            drafter.fc.weight.zero_()[:, 2 * d:] = torch.eye(d)
            drafter.norm.weight.copy_(model.model.norm.weight)
    return drafter


def greedy(model, prompt, n):
    return greedy_continuation(model, prompt, n).tolist()


@pytest.mark.parametrize("prompt_len, spec", [(1, SMALL), (17, SMALL), (17, TreeSpec(7, 10, 16))])
@pytest.mark.parametrize("kind", ["random", "echo"])
def test_greedy_identical_to_plain_greedy_with_eagle3(model, kind, prompt_len, spec):
    prompt = prompt_of(prompt_len)
    want = greedy(model, prompt, NEW)
    out = generate(model, eagle3(model, kind), prompt, NEW, tree=spec)
    assert out.tokens == want
    s = out.stats
    assert 1 + sum(a + 1 for a in s.accepted) == s.new_tokens == NEW and s.prompt_tokens == prompt_len
    assert all(0 < d <= spec.num_nodes for d in s.drafted[:-1]) and s.drafted[-1] <= spec.num_nodes
    assert s.acceptance_length == pytest.approx((NEW - 1) / s.rounds)
    if kind == "echo" and prompt_len == 17:  # its continuation repeats one token: deep paths accepted
        assert min(s.accepted[:-1]) >= 2 and 3 in s.accepted
    stop = max(set(want), key=want.index)  # the token first seen last
    got = generate(model, eagle3(model, kind), prompt, NEW, tree=spec, stop_token_ids=[stop])
    assert got.tokens == want[:want.index(stop) + 1]


@pytest.mark.parametrize("index", range(5))
def test_stop_token_ends_output_at_every_depth(model, index):
    """index 0: the prefill's token; 1..3: the accepted path of the first (depth-3) tree; 4: its bonus."""
    ref = greedy(model, STOP_PROMPT, 9)
    assert len(set(ref)) == len(ref), "fixture drifted: pick a prompt with distinct greedy tokens"
    seen, never = [], next(t for t in range(V) if t not in ref)  # a second stop id, never emitted
    out = generate(model, OracleTreeDrafter(model, V), STOP_PROMPT, 9, tree=SMALL,
                   stop_token_ids=[ref[index], never], on_tokens=seen.append)
    assert out.tokens == ref[:index + 1] and sum(seen, []) == out.tokens
    assert out.stats.rounds == (index > 0) and out.stats.accepted == [index - 1][:out.stats.rounds]


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 5, 9])
def test_max_new_tokens_is_exact(model, budget):
    """The last round's tree is only as deep as the budget allows; stats count its nodes and depths."""
    drafter = OracleTreeDrafter(model, V)
    out = generate(model, drafter, STOP_PROMPT, budget, tree=SMALL)
    assert out.tokens == greedy(model, STOP_PROMPT, 9)[:budget]
    remaining, depths = budget - 1, []
    while remaining > 0:
        depths.append(min(SMALL.depth, remaining - 1))
        remaining -= depths[-1] + 1
    assert drafter.depths == [d for d in depths if d > 0]  # depth 0: a plain forward, no tree drafted
    s = out.stats
    assert s.accepted == depths and s.drafted == [2 * d for d in depths]  # oracle: 2 nodes per depth
    per_depth = [sum(d > i for d in depths) for i in range(max(depths, default=0))]
    assert s.slot_drafted == s.slot_accepted == per_depth


@pytest.mark.parametrize("wrong_depth", [1, 2])
def test_rejected_depth_stops_the_path(model, wrong_depth):
    out = generate(model, OracleTreeDrafter(model, V, wrong_depth), STOP_PROMPT, NEW, tree=SMALL)
    assert out.tokens == greedy(model, STOP_PROMPT, NEW)
    assert out.stats.accepted[:-1] == [wrong_depth - 1] * (out.stats.rounds - 1)
    assert out.stats.slot_accepted[wrong_depth - 1] == 0


@pytest.mark.parametrize("kind, trials, filters", [
    ("eagle3", 800, dict(temperature=0.8, top_k=5, top_p=0.9)),   # ~40 bins
    ("oracle", 800, dict(temperature=0.9, top_k=6, top_p=0.95)),  # siblings before the true node
])
def test_sampling_matches_target_joint_distribution(kind, trials, filters):
    """4 new tokens (a depth-2 first tree), the first 3 counted: multi-level and sibling acceptance."""
    model = tiny_qwen3(vocab_size=V_SMALL, num_layers=3, seed=3)
    prompt = [1, 2, 3]
    drafter = eagle3(model) if kind == "eagle3" else OracleTreeDrafter(model, V_SMALL)
    target, spec = Target(model), TreeSpec(depth=2, topk=3, num_nodes=5)

    def run(seed):
        out = generate(target, drafter, prompt, 4, seed=seed, tree=spec, **filters)
        return out.tokens, sum(out.stats.accepted)
    assert_matches_joint(model, prompt, run, trials, filters)


def test_calls_are_independent(model):
    target, drafter, kw = Target(model), eagle3(model), dict(temperature=1.0, seed=5, tree=SMALL)
    first = generate(target, drafter, prompt_of(17), NEW, **kw)
    generate(target, drafter, prompt_of(2), NEW, **kw)
    again = generate(target, drafter, prompt_of(17), NEW, **kw)
    assert again.tokens == first.tokens and again.stats.accepted == first.stats.accepted


def test_low_precision_tree_round_runs():
    model = tiny_qwen3(dtype=torch.bfloat16)
    drafter = eagle3(model)
    out = generate(model, drafter, prompt_of(5), 8, tree=SMALL)
    assert len(out.tokens) == 8 and out.stats.rounds >= 1


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_nan_target_logits_raise(model, temperature):
    with nan_block_logits(model), pytest.raises(ValueError, match="NaN"):
        generate(model, OracleTreeDrafter(model, V), [1, 2, 3], NEW, temperature=temperature, tree=SMALL)


def test_tree_errors(model):
    with pytest.raises(ValueError, match="draft_tree"):
        generate(model, None, [1, 2], 4, tree=SMALL)
    with pytest.raises(ValueError, match="draft_tree"):
        generate(model, RandomDrafter(V, 4), [1, 2], 4, tree=SMALL)
    with pytest.raises(ValueError, match="TreeSpec"):
        generate(model, eagle3(model), [1, 2], 4, tree=(3, 4, 8))
    with pytest.raises(ValueError, match=">= 1"):
        TreeSpec(0, 10, 16)
    assert TreeSpec.parse("7,10,16") == TreeSpec(7, 10, 16) == TreeSpec()
    for bad in ("7,10", "7,x,16", "7,10,16,1", "-1,2,3"):
        with pytest.raises(ValueError, match="DEPTH,TOPK,NODES"):
            TreeSpec.parse(bad)
