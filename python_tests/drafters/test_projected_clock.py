"""The projected clock: the exact reader of the network's input Eᵀx against independent
references (argmax decoding of the full state for E = I, a direct float64 Gaussian posterior of Eᵀx), and
the state probe's check that the state is as readable at τ = ½ as the clock says."""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, flow
from flashmap_ext.evaluate.state_probe import reader_uniform


def test_reader_of_the_identity_embedding_is_argmax_decoding():
    V, n = 50, 20_000
    g = torch.Generator().manual_seed(3)
    labels, xi = torch.randint(0, V, (n,), generator=g), torch.randn(n, V, generator=g, dtype=torch.float64)
    t = torch.tensor([0.3, 0.5, 0.6], dtype=torch.float64)
    acc = flow.reader_accuracy(flow.whitened_rows(torch.eye(V)), t, labels, xi)
    ref = flow.correct_decoding_prob(t, V)  # Gauss-Hermite P_c of the V-dim state
    sigma = (ref * (1 - ref) / n).sqrt()
    assert ((acc - ref).abs() < 4 * sigma).all(), (acc, ref)


def test_reader_matches_a_direct_gaussian_posterior_of_the_projected_state():
    V, d, n, t = 300, 12, 4000, 0.8
    g = torch.Generator().manual_seed(5)
    emb = torch.randn(V, d, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2.0, d)
    labels = torch.randint(0, V, (n,), generator=g)
    eps = torch.randn(n, V, generator=g, dtype=torch.float64)  # V-dim noise, seen through Eᵀ
    z = (1 - t) * eps @ emb + t * emb[labels]
    prec = torch.linalg.inv((1 - t) ** 2 * emb.T @ emb)  # Eᵀx ~ N(t·E[y], (1−t)²·EᵀE)
    diff = z[:, None, :] - t * emb[None]
    ref = (-0.5 * torch.einsum("nvd,de,nve->nv", diff, prec, diff)).argmax(-1) == labels
    ref_acc = ref.double().mean().item()
    acc = flow.reader_accuracy(flow.whitened_rows(emb), torch.tensor([t], dtype=torch.float64), labels,
                               torch.randn(n, d, generator=g, dtype=torch.float64)).item()
    sigma = (2 * ref_acc * (1 - ref_acc) / n) ** 0.5  # two independent samples
    assert abs(acc - ref_acc) < 4 * sigma, (acc, ref_acc)
    u = torch.linalg.pinv(flow.noise_factor(emb)) @ z.T  # the likelihood itself, up to a per-sample constant
    ll = flow.reader_log_likelihood(u.T, flow.whitened_rows(emb), t)
    ref_ll = -0.5 * torch.einsum("nvd,de,nve->nv", diff, prec, diff)
    assert torch.allclose(ll - ll[:, :1], ref_ll - ref_ll[:, :1], atol=1e-6 * ref_ll.abs().max().item())


@pytest.fixture(scope="module")
def wide_vocab_target():
    return tiny_qwen3(vocab_size=1024, hidden_size=32)  # d/V = 1/32: a projection keeps little of the state


def tiny_drafter(target, clock):
    drafter = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=4, block_size=4, cond_dim=16,
                                         target_layer_ids=(0, 2), two_time=False)
    return drafter.calibrate_clock() if clock == "projected" else drafter


def test_state_is_readable_at_half_where_the_projected_clock_says(wide_vocab_target):
    drafter = tiny_drafter(wide_vocab_target, "projected")
    assert drafter.clock.name == "projected" and drafter.t_mid > flow.t_of_tau(0.5, 1024).item()
    acc = reader_uniform(drafter, [0.25, 0.5, 0.9], samples=6000, seed=11)  # independent of the table's draws
    design = [tau + (1 - tau) / 1024 for tau in (0.25, 0.5, 0.9)]
    assert acc == pytest.approx(design, abs=0.04)


def test_full_state_clock_fails_the_same_check(wide_vocab_target):
    """The check the probe makes can fail: FLM's clock of the V-dim state promises 0.5 at τ = ½, the
    network's d-dim input shows a few percent (0.6 % for the committed 8,192-row drafter)."""
    drafter = tiny_drafter(wide_vocab_target, "full-state")
    assert drafter.clock.name == "full-state"
    (acc,) = reader_uniform(drafter, [0.5], samples=6000, seed=11)
    assert acc < 0.15


def test_clock_table_round_trips_and_old_configs_use_the_full_state_clock(wide_vocab_target, tmp_path):
    drafter = tiny_drafter(wide_vocab_target, "projected")
    drafter.save_pretrained(tmp_path)
    loaded = FlashMapDrafter.from_pretrained(tmp_path, wide_vocab_target)
    assert loaded.clock.name == "projected" and loaded.t_mid == drafter.t_mid
    assert torch.equal(loaded.clock.t_grid, drafter.clock.t_grid)
    old = {k: v for k, v in drafter.config.to_dict().items() if k not in ("clock_t", "clock_tau", "state_loglik")}
    cfg = FlashMapConfig.from_dict(old)
    assert cfg.clock.name == "full-state" and cfg.clock_t is None and not cfg.state_loglik
    with pytest.raises(ValueError, match="clock_t"):
        FlashMapConfig.from_dict({**drafter.config.to_dict(), "clock_tau": None})
    with pytest.raises(ValueError, match="clock_t"):
        FlashMapConfig.from_dict({**drafter.config.to_dict(), "clock_t": [0.0, 0.7, 0.5, 1.0],
                                  "clock_tau": [0.0, 0.1, 0.2, 1.0]})
