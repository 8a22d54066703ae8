"""Stats after a stop token: a round cut by a stop token is recorded as the tokens it
returned, nothing past the stop, for chain rounds and EAGLE-3 tree rounds alike.

Independent reference: the oracle drafters propose plain greedy decoding (every draft is accepted), so
the returned tokens are greedy[:n] with n = min(budget, stop index + 1), and each round commits the next
min(depth + 1, what is left) of them, depth = min(K, budget - committed - 1) (the budget rule). A round
cut by the stop records the drafts before the stop as accepted and the stop in the bonus's place.
"""
import pytest

from conftest import tiny_qwen3
from flashmap_ext.speculate import TreeSpec, generate
from support.drafter_doubles import OracleDrafter, OracleTreeDrafter, greedy_continuation

K = 4
PROMPT = [47, 15, 17, 40, 51, 109, 19, 56, 8, 74]  # its greedy continuation starts with 11 distinct tokens
STOPS = range(11)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def expected_rounds(budget: int, stop: int, depth: int) -> list[tuple[int, int]]:
    """[(depth drafted, drafts accepted)] per round for an always-right drafter of depth `depth`."""
    n, committed, rounds = min(budget, stop + 1), 1, []
    while committed < n:
        d = min(depth, budget - committed - 1)
        kept = min(d + 1, n - committed)
        rounds.append((d, kept - 1))
        committed += kept
    return rounds


def check_stats(stats, tokens, want_tokens, rounds):
    assert tokens == want_tokens
    accepted = [a for _, a in rounds]
    assert stats.new_tokens == len(want_tokens)
    assert stats.rounds == len(rounds) and stats.accepted == accepted
    if rounds:
        assert 1 + sum(accepted) + stats.rounds == len(want_tokens)
        assert stats.acceptance_length == pytest.approx((len(want_tokens) - 1) / len(rounds))
    # slot i is recorded as proposed in a round iff the round returned a token for it: i < accepted, or
    # i < depth when no stop cut the round (then slot `accepted` is the rejected / last one)
    cut = [a < d for d, a in rounds]
    spans = [a if c else d for (d, a), c in zip(rounds, cut)]
    assert stats.depths == spans
    assert [x for x in stats.slot_drafted if x] == [sum(i < s for s in spans) for i in range(max(spans, default=0))]
    assert [x for x in stats.slot_accepted if x] == [sum(i < a for a in accepted)
                                                    for i in range(max(accepted, default=0))]


def budgets(stop: int) -> list[int]:
    return sorted({max(stop, 1), stop + 1, stop + 2, 14})  # below, at and above the stop


@pytest.mark.parametrize("stop", STOPS)
def test_chain_stats_describe_exactly_the_returned_tokens(model, stop):
    ref = greedy_continuation(model, PROMPT, 14).tolist()
    assert len(set(ref[:11])) == 11, "fixture drifted: pick a prompt with distinct greedy tokens"
    for budget in budgets(stop):
        out = generate(model, OracleDrafter(model, K, (1, 2)), PROMPT, budget, stop_token_ids=[ref[stop]])
        rounds = expected_rounds(budget, stop, K)
        check_stats(out.stats, out.tokens, ref[:min(budget, stop + 1)], rounds)
        assert out.stats.drafted == [d for d, _ in rounds]


@pytest.mark.parametrize("stop", STOPS)
def test_tree_stats_describe_exactly_the_returned_tokens(model, stop):
    ref = greedy_continuation(model, PROMPT, 14).tolist()
    spec = TreeSpec(depth=K, topk=4, num_nodes=8)
    for budget in budgets(stop):
        out = generate(model, OracleTreeDrafter(model, model.config.vocab_size), PROMPT, budget, tree=spec,
                       stop_token_ids=[ref[stop]])
        rounds = expected_rounds(budget, stop, K)
        check_stats(out.stats, out.tokens, ref[:min(budget, stop + 1)], rounds)
        assert out.stats.drafted == [2 * d for d, _ in rounds]  # a true node and a wrong sibling per depth
