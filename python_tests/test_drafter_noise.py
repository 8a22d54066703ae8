"""The FlashMap drafter's noise stream (rng.drafter_xi): Philox4x32-10 in torch integer ops + Box–Muller
against an independent pure-Python implementation (rng.philox4x32_10_words, whose known answers
test_verify_exact.py checks, and `math`), its statistics, its key-only dependence, and — on a GPU —
bit-identical CPU/CUDA values, no host sync and CUDA-graph capture."""
import math

import pytest
import torch

from flashmap_ext import rng
from flashmap_ext.rng import philox4x32_10_words as philox_reference

M64 = 2**64 - 1


def xi_reference(seed: int, position: int, slot: int, dim: int, stream: int = rng.DRAFTER_STREAM) -> float:
    """ξ[slot, dim] of row (seed, position), in float64 Python: the generator's definition, written out."""
    s, p = seed & M64, position & M64
    words = philox_reference((p, p >> 32, stream, (slot + 1) * 2**16 + dim // 4), (s, s >> 32))
    pair = dim % 4 // 2
    radius = math.sqrt(-2.0 * math.log((words[2 * pair] + 0.5) / 2**32))
    theta = 2.0 * math.pi * (words[2 * pair + 1] + 0.5) / 2**32
    return radius * (math.cos(theta) if dim % 2 == 0 else math.sin(theta))


KEYS = [(7, 100), (-3, 2**40 + 3), (2**63 - 1, 0), (0, 2**63 - 1), (1234, 57)]


def test_philox_words_equal_the_reference_exactly():
    g = torch.Generator().manual_seed(0)
    counter = torch.randint(0, 2**32, (64, 4), generator=g, dtype=torch.int64)
    key = torch.randint(0, 2**32, (64, 2), generator=g, dtype=torch.int64)
    counter[0], key[0] = 2**32 - 1, 2**32 - 1  # all-ones words: the largest products
    counter[1], key[1] = 0, 0
    out = rng.philox4x32_10(counter, key)
    expected = [philox_reference(tuple(c), tuple(k)) for c, k in zip(counter.tolist(), key.tolist())]
    assert out.dtype == torch.int64 and out.tolist() == [list(w) for w in expected]


def test_drafter_counter_layout_and_disjoint_from_verifier_coins():
    counter, key = rng.drafter_counter(torch.tensor([-3]), torch.tensor([2**40 + 3]), 3, 10)
    assert counter.shape == (1, 3, 3, 4) and key.shape == (1, 1, 1, 2)
    assert counter[0, 2, 1].tolist() == [3, 2**8, rng.DRAFTER_STREAM, 3 * 2**16 + 1]
    assert key[0, 0, 0].tolist() == [(-3) & 0xFFFFFFFF, 0xFFFFFFFF]
    assert (counter[..., 3] >= 2**16).all(), "word 3 = 0 is the verifier's; the drafter never uses it"


def test_xi_matches_the_pure_python_generator():
    seed, position = (torch.tensor(col) for col in zip(*KEYS))
    xi = rng.drafter_xi(seed, position, (3, 10))  # d = 10: a partial last Philox block
    ref = torch.tensor([[[xi_reference(s, p, k, i) for i in range(10)] for k in range(3)] for s, p in KEYS],
                       dtype=torch.float64)
    assert xi.shape == (5, 3, 10) and xi.dtype == torch.float32
    assert (xi.double() - ref).abs().max() < 1e-6
    assert torch.equal(xi, ref.float()), "the fp64 value is rounded once to fp32"


def test_xi_row_depends_only_on_its_seed_position_slot_and_dim():
    seed, position = torch.tensor([7, 7, 8, 7]), torch.tensor([100, 101, 100, 100])
    xi = rng.drafter_xi(seed, position, (3, 5))
    for b in range(4):  # alone, or in any batch: the same row
        assert torch.equal(rng.drafter_xi(seed[b:b + 1], position[b:b + 1], (3, 5))[0], xi[b])
    assert torch.equal(xi[0], xi[3]), "equal keys, equal noise, whatever the batch row"
    assert not torch.equal(xi[0], xi[1]) and not torch.equal(xi[0], xi[2])
    wider = rng.drafter_xi(seed, position, (7, 13))
    assert torch.equal(wider[:, :3, :5], xi), "slot k, dim i never depend on K or d"
    other_stream = rng.drafter_xi(seed, position, (3, 5), stream=0)
    assert not torch.isclose(other_stream, xi).any()
    with pytest.raises(ValueError, match="shape"):
        rng.drafter_xi(seed, position, (0, 5))


def _ks_statistic(x: torch.Tensor) -> float:
    """sup |F_n − Φ| of the sample x against the standard normal CDF."""
    x = x.double().sort().values
    n = x.numel()
    cdf = torch.special.ndtr(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - cdf).max().item(), (cdf - (i - 1) / n).max().item())


def test_xi_is_standard_normal():
    seed = torch.arange(256) * 7919 - 1000
    xi = rng.drafter_xi(seed, seed.flip(0) + 40, (16, 64))
    x = xi.flatten().double()
    n = x.numel()
    assert abs(x.mean().item()) < 5 / math.sqrt(n)
    assert abs(x.var().item() - 1) < 5 * math.sqrt(2 / n)
    assert abs((x ** 4).mean().item() - 3) < 5 * math.sqrt(96 / n), "kurtosis: Gaussian tails"
    assert _ks_statistic(x) < 1.95 / math.sqrt(n), "Kolmogorov–Smirnov at α = 0.001"
    assert x.abs().max() < math.sqrt(2 * 33 * math.log(2)), "u >= 2^-33 bounds |ξ|"


def _corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    return ((a * b).sum() / (a.norm() * b.norm())).item()


def test_xi_is_uncorrelated_across_slots_positions_seeds_and_dims():
    n_rows, K, d = 512, 8, 64
    base = torch.arange(n_rows) * 1000
    xi = rng.drafter_xi(torch.full((n_rows,), 5), base, (K, d))
    bound = 4.5 / math.sqrt(n_rows * (K - 1) * d)
    assert abs(_corr(xi[:, :-1], xi[:, 1:])) < bound, "neighbouring slots"
    assert abs(_corr(xi[..., 0::2], xi[..., 1::2])) < 2 * bound, "cos/sin halves of one Box–Muller pair"
    assert abs(_corr(xi[..., 0::4], xi[..., 2::4])) < 2 * bound, "the two pairs of one Philox block"
    next_position = rng.drafter_xi(torch.full((n_rows,), 5), base + 1, (K, d))
    next_seed = rng.drafter_xi(torch.full((n_rows,), 6), base, (K, d))
    assert abs(_corr(xi, next_position)) < bound and abs(_corr(xi, next_seed)) < bound


def test_xi_traces_without_graph_breaks():
    """fullgraph=True fails on .item()/.tolist() or data-dependent shapes: the CPU proxy for capturability."""
    torch._dynamo.reset()
    fn = torch.compile(lambda s, p: rng.drafter_xi(s, p, (4, 12)), backend="aot_eager", fullgraph=True)
    seed, position = torch.tensor([3, -9]), torch.tensor([2**33, 5])
    assert torch.equal(fn(seed, position), rng.drafter_xi(seed, position, (4, 12)))


# ------------------------------------------------------------------ CUDA
@pytest.mark.cuda
def test_xi_on_cuda_is_bit_identical_to_cpu_without_host_sync():
    seed = torch.tensor([s for s, _ in KEYS] + list(range(-20, 20)))
    position = torch.tensor([p for _, p in KEYS] + [3 * i + 2**31 for i in range(40)])
    cpu = rng.drafter_xi(seed, position, (16, 200))
    seed_d, position_d = seed.cuda(), position.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = rng.drafter_xi(seed_d, position_d, (16, 200))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)


@pytest.mark.cuda
def test_xi_replays_from_a_cuda_graph():
    seed, position = torch.zeros(3, dtype=torch.int64, device="cuda"), torch.zeros(3, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        rng.drafter_xi(seed, position, (16, 64))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rng.drafter_xi(seed, position, (16, 64))
    for s, p in [([1, 2, 3], [10, 11, 12]), ([-5, 0, 2**40], [2**35, 7, 7])]:
        seed.copy_(torch.tensor(s))
        position.copy_(torch.tensor(p))
        graph.replay()
        assert torch.equal(out.cpu(), rng.drafter_xi(torch.tensor(s), torch.tensor(p), (16, 64)))
