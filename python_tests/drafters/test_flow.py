"""flow.py against independent references: Monte-Carlo decoding error, adaptive quadrature, an exact
one-token flow integrated with RK4, and empirical covariances."""
import math

import numpy as np
import pytest
import torch

from flashmap_ext.drafters.flashmap import flow

QWEN_V = 151_936


@pytest.mark.parametrize("vocab,ts,n", [(20, (0.35, 0.5, 0.65), 100_000), (1000, (0.6, 0.7), 20_000)])
def test_tau_matches_monte_carlo_decoding_error(vocab, ts, n):
    g = torch.Generator().manual_seed(1234)
    for t in ts:
        x = (1 - t) * torch.randn(n, vocab, generator=g, dtype=torch.float64)
        x[:, 0] += t  # data token 0; argmax == 0 is a correct decoding
        p_correct = (x.argmax(-1) == 0).double().mean().item()
        tau_mc = (vocab * p_correct - 1) / (vocab - 1)
        sigma = vocab / (vocab - 1) * math.sqrt(p_correct * (1 - p_correct) / n)
        tau = flow.tau_of_t(torch.tensor(t, dtype=torch.float64), vocab).item()
        assert abs(tau - tau_mc) < 3 * sigma, (vocab, t, tau, tau_mc, sigma)


def test_table_for_qwen_vocab_matches_published_values():
    taus = torch.tensor([0.0, 0.01, 0.5, 0.99, 1.0], dtype=torch.float64)
    t = flow.t_of_tau(taus, QWEN_V)
    assert t[0].item() == 0.0 and t[-1].item() == 1.0, "endpoints must be exact"
    assert t[1:4].tolist() == pytest.approx([0.675, 0.817, 0.873], abs=1e-3)
    assert flow.tau_of_t(0.0, QWEN_V).item() == 0.0 and flow.tau_of_t(1.0, QWEN_V).item() == 1.0


def test_table_agrees_with_adaptive_quadrature():
    scipy = pytest.importorskip("scipy")
    from scipy import integrate, special, stats
    for t in (0.7, 0.8, 0.85):
        a = t / (1 - t)
        f = lambda z: stats.norm.pdf(z) * math.exp((QWEN_V - 1) * special.log_ndtr(z + a))  # noqa: E731
        p_c = integrate.quad(f, -12, 12, points=[4.3 - a], limit=400, epsabs=1e-14)[0]
        tau_ref = (QWEN_V * p_c - 1) / (QWEN_V - 1)
        assert flow.tau_of_t(t, QWEN_V).item() == pytest.approx(tau_ref, abs=1e-6), (scipy.__version__, t)


@pytest.mark.parametrize("vocab", [2, 111, QWEN_V])
def test_table_is_strictly_monotone_and_invertible(vocab):
    tau = torch.linspace(0, 1, 5001, dtype=torch.float64)
    t = flow.t_of_tau(tau, vocab)
    assert (t.diff() > 0).all()
    assert torch.allclose(flow.tau_of_t(t, vocab), tau, atol=1e-9)
    t32 = flow.t_of_tau(tau.float(), vocab)
    assert t32.dtype == torch.float32 and torch.allclose(t32.double(), t, atol=1e-6)


def test_noise_covariance_matches_gram():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(40, 6, generator=g, dtype=torch.float64) * torch.tensor([0.1, 1, 2, 0.5, 3, 1])
    emb[:, 1] += 0.8 * emb[:, 4]  # strongly correlated columns: a diagonal factor would fail
    gram = emb.T @ emb
    n = 200_000
    z = flow.d_space_noise(flow.noise_factor(emb), torch.randn(n, 6, generator=g, dtype=torch.float64))
    cov = z.T @ z / n
    stderr = ((gram.diag()[:, None] * gram.diag()[None, :] + gram ** 2) / n).sqrt()
    assert ((cov - gram).abs() / stderr).max() < 5


def test_noise_factor_is_exact_square_root_even_when_singular():
    g = torch.Generator().manual_seed(1)
    for v, d in [(50, 8), (4, 8)]:  # V < d: E^T E is singular, Cholesky fails, eigen square root is used
        emb = torch.randn(v, d, generator=g).to(torch.bfloat16)
        factor = flow.noise_factor(emb)
        gram = emb.double().T @ emb.double()
        assert factor.dtype == torch.float64
        assert torch.allclose(factor @ factor.T, gram, atol=1e-8 * gram.abs().max().item())


def test_jump_identities():
    g = torch.Generator().manual_seed(2)
    x, delta = torch.randn(4, 9, generator=g), torch.softmax(torch.randn(4, 9, generator=g), -1)
    s, t = torch.tensor([0.0, 0.3, 0.6, 0.9]), torch.tensor([0.2, 0.3, 1.0, 0.95])
    assert torch.allclose(flow.flow_map_jump(x, delta, s, s), x)  # X_{t,t} = id
    assert torch.allclose(flow.flow_map_jump(x, delta, s, torch.ones(4)), delta)  # X_{s,1} = δ_{s,1}
    onehot = torch.nn.functional.one_hot(torch.arange(4), 9).float()
    assert torch.allclose(flow.flow_map_jump(x, onehot, torch.zeros(4), t), flow.interpolant(x, onehot, t))
    assert flow.semigroup_weight(torch.tensor(0.1), torch.tensor(0.5), torch.tensor(1.0)).item() == 0.0


def _exact_flow(x, s, t, log_prior, steps=1000):
    """RK4 (numpy, fp64) of dx/dt = (D_t(x) − x)/(1 − t) for one token with prior π, whose exact
    posterior is D_t(x) = softmax(log π + t·x/(1−t)²) (Bayes' rule for the Gaussian interpolant)."""
    def b(tt, xx):
        logits = log_prior + tt * xx / (1 - tt) ** 2
        p = np.exp(logits - logits.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True) - xx) / (1 - tt)
    h = (t - s) / steps
    for i in range(steps):
        tt = s + i * h
        k1 = b(tt, x)
        k2 = b(tt + h / 2, x + h / 2 * k1)
        k3 = b(tt + h / 2, x + h / 2 * k2)
        x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + b(tt + h, x + h * k3))
    return x


def _delta(x, s, t, log_prior):
    """δ_{s,t}(x) solved from X_{s,t} = ((1−t)/(1−s))·x + ((t−s)/(1−s))·δ."""
    return (_exact_flow(x, s, t, log_prior) - (1 - t) / (1 - s) * x) * (1 - s) / (t - s)


@pytest.mark.parametrize("s,u,t", [(0.2, 0.5, 0.8), (0.0, 0.7, 0.9), (0.3, 0.35, 0.6)])
def test_semigroup_on_an_exact_flow(s, u, t):
    log_prior = np.log([0.5, 0.3, 0.2])
    x = np.random.default_rng(3).standard_normal((5, 3))
    d_st, d_su = _delta(x, s, t, log_prior), _delta(x, s, u, log_prior)
    assert np.allclose(d_st.sum(-1), 1.0, atol=1e-9), "δ lies on the simplex"
    x_su = flow.flow_map_jump(torch.from_numpy(x), torch.from_numpy(d_su), torch.tensor(s), torch.tensor(u))
    gamma = flow.semigroup_weight(torch.tensor(s), torch.tensor(u), torch.tensor(t)).item()
    composed = gamma * d_su + (1 - gamma) * _delta(x_su.numpy(), u, t, log_prior)
    assert np.allclose(composed, d_st, atol=1e-7)
    assert not np.allclose(d_su, d_st, atol=1e-3), "the check must be able to fail"
