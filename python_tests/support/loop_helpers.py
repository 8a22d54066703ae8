"""Shared references of the decoding-loop tests (chain and tree): prompts, the target's exact joint law of
the first 3 tokens at T > 0 (enumeration of every prefix in one batched forward) and a pooled
chi-square test against it."""
import contextlib
import math

import torch

V_SMALL = 8   # vocabulary of the T > 0 targets: 8^3 joint bins


def prompt_of(length: int, vocab: int = 111) -> list:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """fp64 p after temperature, top-k (on logits) then top-p (smallest nucleus reaching top_p)."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    if top_k:
        kth = p.topk(top_k, dim=-1).values[..., -1:]
        p = torch.where(p >= kth, p, 0.0)
        p = p / p.sum(-1, keepdim=True)
    if top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        above = sorted_p.cumsum(-1) - sorted_p
        keep = torch.zeros_like(p).scatter(-1, order, (above < top_p).double())
        p = p * keep / (p * keep).sum(-1, keepdim=True)
    return p


def exact_joint(model, prompt: list, **filters) -> torch.Tensor:
    """[V, V, V] P(t1, t2, t3 | prompt) from one forward over every (t1, t2) continuation."""
    V = model.config.vocab_size
    pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    ids = torch.cat([torch.tensor(prompt).expand(V * V, -1), pairs], dim=1)
    with torch.no_grad():
        p = filtered_probs(model(input_ids=ids).logits[:, -3:], **filters)   # [V*V, 3, V]
    p1, p2, p3 = p[0, 0], p[::V, 1], p[:, 2].view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple:
    """(statistic, df): every bin of expected count < 5 pooled into one (grown with the next smallest
    bins until the pool's expected count reaches 5)."""
    expected = probs.flatten() * counts.sum()
    order = expected.argsort()
    cum = expected[order].cumsum(0)
    n_small = max(int((expected < 5).sum()), int((cum < 5).sum()) + 1) if expected.min() < 5 else 0
    small, big = order[:n_small], order[n_small:]
    counts = counts.flatten()
    obs = torch.cat([counts[small].sum().view(1), counts[big]]) if n_small else counts
    exp = torch.cat([expected[small].sum().view(1), expected[big]]) if n_small else expected
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def assert_matches_joint(model, prompt: list, run, trials: int, filters: dict, paths: bool = True) -> None:
    """`run(seed) -> (tokens, accepted)` over `trials` seeds: the first 3 tokens follow the target's joint
    law (pooled chi-square, df + 10 sd), both accept and reject paths were taken (unless `paths` is False:
    the caller cannot see them), and a hotter law (temperature × 1.5) is rejected (power)."""
    V = model.config.vocab_size
    counts, accepted = torch.zeros(V, V, V, dtype=torch.float64), 0
    for seed in range(trials):
        tokens, acc = run(seed)
        counts[tuple(tokens[:3])] += 1
        accepted += acc
    stat, df = chi_square(counts, exact_joint(model, prompt, **filters))
    assert stat < df + 10 * math.sqrt(2 * df), (stat, df)
    assert not paths or 0.05 * trials < accepted < 1.9 * trials, accepted  # both accept and reject paths taken
    hotter = exact_joint(model, prompt, **{**filters, "temperature": 1.5 * filters["temperature"]})
    stat_hot, df_hot = chi_square(counts, hotter)
    assert stat_hot > df_hot + 10 * math.sqrt(2 * df_hot), (stat_hot, df_hot)


@contextlib.contextmanager
def nan_block_logits(model):
    """NaN in logit column 3 of every forward that keeps more than one position (the verify blocks, not the
    prefill's single row)."""
    def poison(module, args, out):
        if out.shape[1] > 1:
            out[..., 3] = float("nan")
    handle = model.lm_head.register_forward_hook(poison)
    try:
        yield
    finally:
        handle.remove()
