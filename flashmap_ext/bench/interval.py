"""A paired bootstrap interval for a difference of two pooled γ measured on the same prompts (the shuffle test).

Each prompt contributes a pair of counts per arm: accepted drafts A and target rounds R. The arm's pooled γ is
(Σ A + Σ R) / Σ R (bench/metrics.acceptance_length), so Δγ = γ(arm 1) − γ(arm 2) is a ratio of sums, not a mean of
per-prompt values. The interval resamples whole prompts with replacement (both arms of a prompt together:
paired), separately within each stratum (dataset) when strata are given, recomputes the pooled Δγ of every
resample and takes its (1 − level)/2 and (1 + level)/2 quantiles: the percentile interval of Efron & Tibshirani,
"An Introduction to the Bootstrap" (1993), §13.3; strata resampled separately as for several independent samples
in Davison & Hinkley, "Bootstrap Methods and their Application" (1997), ch. 3. With few prompts (≲ 10 per
stratum) the percentile interval tends to be too narrow: read an interval near 0 as inconclusive.
"""
from __future__ import annotations

import numpy as np

#: bootstrap resamples and generator seed (fixed: the same counts always give the same interval)
RESAMPLES = 10_000
SEED = 0


def pooled_delta(counts: np.ndarray) -> np.ndarray:
    """counts (..., 4) float64 summed over prompts as [A₁, R₁, A₂, R₂] → Δγ (...) = (A₁+R₁)/R₁ − (A₂+R₂)/R₂."""
    a1, r1, a2, r2 = np.moveaxis(counts, -1, 0)
    return (a1 + r1) / r1 - (a2 + r2) / r2


def _check(counts: np.ndarray, strata: np.ndarray) -> None:
    if counts.ndim != 2 or counts.shape[1] != 4:
        raise ValueError(f"counts: expected shape (prompts, 4) as [A1, R1, A2, R2], got {tuple(counts.shape)}")
    if (counts < 0).any() or (counts[:, [1, 3]] == 0).any():
        raise ValueError("counts: need A >= 0 and R >= 1 (a prompt with no rounds has no γ; leave it out)")
    if strata.shape != (counts.shape[0],):
        raise ValueError(f"strata: expected shape ({counts.shape[0]},), got {tuple(strata.shape)}")


def resampled_sums(counts: np.ndarray, strata: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(resamples, 4) float64: column sums of `counts` rows drawn with replacement, n_s draws within each
    stratum s of n_s prompts (numpy Generator PCG64 seeded with `seed`)."""
    rng = np.random.default_rng(seed)
    total = np.zeros((resamples, 4))
    for s in np.unique(strata):
        rows = counts[strata == s]
        total += rows[rng.integers(0, len(rows), size=(resamples, len(rows)))].sum(axis=1)
    return total


def delta_interval(counts, strata=None, level: float = 0.95, resamples: int = RESAMPLES,
                   seed: int = SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval (low, high) of the pooled Δγ (module docstring).

    counts: (prompts, 4) ints or floats, per prompt [A₁, R₁, A₂, R₂] (accepted drafts, rounds of arm 1, then
    arm 2). strata: (prompts,) labels resampled separately (default: one stratum). level in (0, 1).
    None when every stratum has a single prompt (nothing to resample). ValueError naming the argument otherwise.
    """
    counts = np.asarray(counts, dtype=np.float64)
    strata = np.zeros(len(counts), dtype=int) if strata is None else np.asarray(strata)
    _check(counts, strata)
    if not 0 < level < 1:
        raise ValueError(f"level: expected in (0, 1), got {level}")
    if len(np.unique(strata)) == len(counts):
        return None
    deltas = pooled_delta(resampled_sums(counts, strata, resamples, seed))
    low, high = np.quantile(deltas, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
