"""GenerateStats and streaming: counts that follow from a drafter with a known acceptance schedule."""

import math

import pytest

from conftest import tiny_qwen3
from flashmap_ext.speculate import Timer, generate
from support.drafter_doubles import OracleDrafter, ScheduledRejectDrafter

K, N = 4, 14
PROMPT = [7, 1, 42, 42, 9]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(num_layers=2)


def test_autoregressive_baseline_stats(model):
    chunks = []
    out = generate(model, None, PROMPT, N, on_tokens=chunks.append)
    s = out.stats
    assert s.prompt_tokens == len(PROMPT) and s.new_tokens == N and len(out.tokens) == N
    assert s.rounds == N - 1 and s.drafted == [0] * (N - 1) and s.accepted == [0] * (N - 1)
    assert s.acceptance_length == 1.0 and s.slot_drafted == [] and s.slot_accepted == []
    assert chunks == [[t] for t in out.tokens]


def test_schedule_gives_exact_counts(model):
    """Slots rejected in turn at j = 0, 1, ..., K: rounds commit 1, 2, ..., K+1 tokens."""
    chunks = []
    drafter = ScheduledRejectDrafter(model, K, range(K + 1), (0, 1))
    out = generate(model, drafter, PROMPT, N, on_tokens=chunks.append)
    s = out.stats
    # budget N = 14: first token, then rounds committing 1, 2, 3, 4, then 3 left: draft 2, accept 2
    assert s.drafted == [4, 4, 4, 4, 2] and s.accepted == [0, 1, 2, 3, 2]
    assert s.slot_drafted == [5, 5, 4, 4] and s.slot_accepted == [4, 3, 1, 0]
    assert s.rounds == 5 and s.acceptance_length == pytest.approx((8 + 5) / 5)
    assert [len(c) for c in chunks] == [1, 1, 2, 3, 4, 3] and sum(chunks, []) == out.tokens
    assert 1 + sum(a + 1 for a in s.accepted) == len(out.tokens) == s.new_tokens == N


def test_times_and_throughput(model):
    out = generate(model, OracleDrafter(model, K, (0,)), PROMPT, N, timer=Timer(sync=True))
    s = out.stats
    assert min(s.prefill_time_s, s.draft_time_s, s.verify_time_s) > 0
    assert s.total_time_s >= s.prefill_time_s + s.draft_time_s + s.verify_time_s
    assert s.tokens_per_s == pytest.approx(N / s.total_time_s)
    assert s.acceptance_length == pytest.approx(13 / 3)  # rounds commit 5, 5, 3
    assert f"γ = {s.acceptance_length:.2f}" in s.summary()


def test_stop_and_empty_budget_stats(model):
    ref = generate(model, None, PROMPT, N).tokens
    stop = ref[6]
    out = generate(model, OracleDrafter(model, K, (0,)), PROMPT, N, stop_token_ids=[stop])
    first = ref.index(stop)
    assert out.tokens == ref[:first + 1] and out.stats.new_tokens == first + 1
    empty = generate(model, None, PROMPT, 0).stats
    assert empty.rounds == 0 and empty.new_tokens == 0 and empty.acceptance_length is None  # no round: no γ
    assert "γ = n/a (no round after prefill)" in empty.summary()
    rows = [o.stats for o in generate(model, None, [PROMPT, PROMPT], [3, 0])]  # a 0-budget row: as a lone call
    assert rows[0].tokens_per_s > 0 and math.isnan(rows[1].tokens_per_s) and math.isnan(empty.tokens_per_s)
    assert "n/a tokens/s" in rows[1].summary() and "n/a tokens/s" in empty.summary()
    one = generate(model, OracleDrafter(model, K, (0,)), PROMPT, 1).stats  # the prefill's token alone
    assert one.rounds == 0 and one.new_tokens == 1 and one.acceptance_length is None
