"""The shuffle test's Δγ interval (bench/interval.py, bench/shuffle.py) against references computed here: the exact
bootstrap distribution by enumerating every resample (float64 loops), scipy's bootstrap, and cases whose answer
follows from arithmetic alone."""
import itertools
import math

import numpy as np
import pytest

from flashmap_ext.bench.interval import delta_interval
from flashmap_ext.bench.metrics import Record
from flashmap_ext.bench.shuffle import prompt_counts, summary

# per prompt [A shared, R shared, A per-slot, R per-slot]
COUNTS = [[30, 20, 18, 22], [12, 18, 15, 17], [40, 16, 21, 19], [9, 25, 8, 25], [22, 21, 14, 23]]


def pooled_delta_ref(rows) -> float:
    a1, r1, a2, r2 = (math.fsum(float(r[i]) for r in rows) for i in range(4))
    return (a1 + r1) / r1 - (a2 + r2) / r2


def exact_distribution(groups) -> list[float]:
    """Every equally likely stratified resample: n_s draws with replacement within each group."""
    per_group = [list(itertools.product(g, repeat=len(g))) for g in groups]
    return sorted(pooled_delta_ref([row for part in combo for row in part])
                  for combo in itertools.product(*per_group))


def quantile_ref(sorted_values, q) -> float:
    return sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)]


def assert_matches_exact(interval, exact, level=0.95, slack=0.01):
    low, high = interval
    tail = (1 - level) / 2
    assert quantile_ref(exact, tail - slack) <= low <= quantile_ref(exact, tail + slack)
    assert quantile_ref(exact, 1 - tail - slack) <= high <= quantile_ref(exact, 1 - tail + slack)


def test_interval_matches_the_exact_bootstrap_distribution():
    # 5 prompts: all 5^5 = 3,125 resamples enumerated; the Monte Carlo quantiles must fall within ±1 % of them
    assert_matches_exact(delta_interval(COUNTS, resamples=40_000), exact_distribution([COUNTS]))
    assert_matches_exact(delta_interval(COUNTS, level=0.8, resamples=40_000), exact_distribution([COUNTS]), 0.8)


def test_stratified_interval_resamples_within_each_dataset():
    # one dataset where shared noise wins by far, one where it loses a little: 2^2 · 3^3 = 108 resamples, each
    # holding 2 prompts of the first and 3 of the second; pooled over both, resamples of one dataset only widen it
    counts = [[40, 10, 10, 10], [30, 10, 12, 10], [10, 10, 14, 10], [11, 10, 16, 10], [9, 10, 12, 10]]
    strata = ["gsm8k", "gsm8k", "mtbench", "mtbench", "mtbench"]
    exact = exact_distribution([counts[:2], counts[2:]])
    assert_matches_exact(delta_interval(counts, strata, resamples=40_000), exact)
    assert_matches_exact(delta_interval(counts, resamples=40_000), exact_distribution([counts]))
    low, high = delta_interval(counts)
    assert low < quantile_ref(exact, 0.0) and high > quantile_ref(exact, 1.0)


def test_interval_agrees_with_scipy_paired_percentile_bootstrap():
    stats = pytest.importorskip("scipy.stats")
    cols = [np.array(c, dtype=float) for c in zip(*COUNTS)]

    def pooled(a1, r1, a2, r2, axis=-1):
        return (a1.sum(axis) + r1.sum(axis)) / r1.sum(axis) - (a2.sum(axis) + r2.sum(axis)) / r2.sum(axis)

    ref = stats.bootstrap(cols, pooled, paired=True, vectorized=True, n_resamples=40_000, method="percentile",
                          confidence_level=0.95, random_state=np.random.default_rng(7)).confidence_interval
    assert delta_interval(COUNTS, resamples=40_000) == pytest.approx((ref.low, ref.high), abs=0.02)


def test_every_prompt_better_with_shared_noise_excludes_zero():
    # equal rounds in both arms: any resample's Δγ = Σ(A₁ − A₂) / ΣR > 0, so the interval must lie above 0
    counts = [[a + d, r, a, r] for a, d, r in ((10, 1, 20), (3, 2, 15), (25, 1, 30), (7, 4, 12), (0, 1, 9))]
    low, high = delta_interval(counts)
    assert 0 < low <= pooled_delta_ref(counts) <= high


def test_mirrored_prompts_include_zero():
    # each prompt's arms swapped in its twin: the resample distribution is symmetric about 0
    base = [[30, 20, 18, 22], [12, 18, 15, 17], [40, 16, 21, 19]]
    counts = base + [[a2, r2, a1, r1] for a1, r1, a2, r2 in base]
    low, high = delta_interval(counts)
    assert pooled_delta_ref(counts) == pytest.approx(0.0) and low < 0 < high
    assert low == pytest.approx(-high, abs=0.05)


def test_no_interval_from_one_prompt_per_stratum_and_same_seed_same_interval():
    assert delta_interval(COUNTS[:1]) is None and delta_interval(COUNTS[:2], ["a", "b"]) is None
    assert delta_interval(COUNTS) == delta_interval(COUNTS) != delta_interval(COUNTS, seed=1)


@pytest.mark.parametrize("counts, kwargs, message", [
    ([[1, 2, 3]], {}, "counts: expected shape (prompts, 4)"),
    ([[1, 0, 3, 4], [1, 2, 3, 4]], {}, "counts: need A >= 0 and R >= 1"),
    ([[1, 2, 3, 4], [1, 2, 3, 4]], {"strata": ["a"]}, "strata: expected shape (2,)"),
    ([[1, 2, 3, 4], [1, 2, 3, 4]], {"level": 1.0}, "level: expected in (0, 1)")])
def test_interval_argument_errors(counts, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        delta_interval(counts, **kwargs)


def record(pid, accepted):
    return Record("FlashMap-2", "d", pid, [0] * 4, 1.0, drafted=[8] * len(accepted), accepted=accepted)


def test_summary_pools_prompts_and_skips_prompts_without_rounds():
    pairs = [prompt_counts(record("a#1", [3, 0, 2]), record("a#1", [1, 0, 0])),
             prompt_counts(record("b#1", [5, 1]), record("b#1", [2, 2])),
             prompt_counts(record("c#1", []), record("c#1", []))]
    assert pairs[0]["counts"] == [5, 3, 1, 3] and pairs[0]["shared"] == pytest.approx(8 / 3)
    row = summary(pairs, ["d"] * 3)
    assert row["shared"] == pytest.approx((5 + 6 + 5) / 5) and row["per_slot"] == pytest.approx((1 + 4 + 5) / 5)
    assert row["delta"] == pytest.approx(pooled_delta_ref([p["counts"] for p in pairs[:2]]))
    assert row["prompts"] == 3 and row["interval"] == list(delta_interval([p["counts"] for p in pairs[:2]]))
