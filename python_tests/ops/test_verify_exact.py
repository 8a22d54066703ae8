"""verify: exact equality with the float64 reference (injected or Philox coins), greedy rules, ties,
mixed batches, awkward shapes, dtypes, non-contiguous logits, K = 0 (the plain sampler)."""
import math

import pytest
import torch

from flashmap_ext import ops
from flashmap_ext.ops.verify_reference import verify_reference_detailed
from flashmap_ext.rng import philox4x32_10_words as philox4x32_10
from flashmap_ext.rng import verify_uniform
from support.verify_helpers import DEVICES, FRAGILE, check_against_reference, per_row, random_case

# Random123 kat_vectors, philox4x32 10.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_verify_philox_known_answers(counter, key, expected):
    assert philox4x32_10(counter, key) == expected


def test_verify_uniform_range_and_streams(monkeypatch):
    us = [verify_uniform(s, p, st) for s in range(20) for p in range(20) for st in range(3)]
    assert all(0.0 <= u < 1.0 for u in us) and len(set(us)) > 0.99 * len(us)
    # seed 0, position 0, stream 0 is Philox's all-zero counter and key: the first KAT word's top 24 bits
    assert verify_uniform(0, 0, 0) == (PHILOX_KAT[0][2][0] >> 8) / 2**24
    # the extreme words map to the ends of a 24-bit uniform on [0, 1): 0 and 1 - 2**-24, never 1
    import flashmap_ext.rng as rng
    for word, expected in ((0, 0.0), (2**32 - 1, 1.0 - 2.0**-24)):
        monkeypatch.setattr(rng, "philox4x32_10_words", lambda counter, key, w=word: (w, 0, 0, 0))
        assert rng.verify_uniform(5, 9, 1) == expected


@pytest.mark.parametrize("device", DEVICES)
def test_verify_greedy_accept_all_and_reject_positions(device):
    B, K, V = 3, 5, 111
    logits, _ = random_case(B, K, V)
    best = logits.argmax(-1)                       # [B, K+1]
    drafts = best[:, :K].clone()
    drafts[1, 0] = (best[1, 0] + 1) % V            # row 1 rejects at slot 0
    drafts[2, K - 1] = (best[2, K - 1] + 1) % V    # row 2 rejects at slot K-1
    out = ops.verify(logits.to(device), drafts.to(device))
    expected = torch.full((B, K + 1), -1)
    expected[0] = best[0]
    expected[1, 0] = best[1, 0]
    expected[2, :K] = best[2, :K]
    assert out.tokens.cpu().tolist() == expected.tolist()
    assert out.num_accepted.cpu().tolist() == [K, 0, K - 1]
    assert out.status.cpu().tolist() == [0, 0, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_verify_greedy_ties_lowest_index_like_argmax(device, dtype):
    logits = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]], [[-1.0, 3.0, 3.0], [5.0, 5.0, 5.0]]], dtype=dtype)
    drafts = torch.tensor([[0], [2]])
    out = ops.verify(logits.to(device), drafts.to(device))
    assert out.tokens.cpu().tolist() == [[0, 1], [1, -1]]        # [1,1,0] accepts 0; [-1,3,3] wants 1
    assert out.tokens[0, 1].item() == torch.argmax(logits[0, 1].float()).item()


@pytest.mark.parametrize("device", DEVICES)
def test_verify_mixed_greedy_and_sampling_batch(device):
    B, K, V = 17, 4, 111
    logits, drafts = random_case(B, K, V, scale=1.5)
    temperature = torch.tensor([0.0, 1.0, 0.6] * 5 + [0.0, 1.0])
    top_k = torch.tensor([0, 0, 10] * 5 + [0, 5], dtype=torch.int32)
    uniforms = torch.rand(B, K + 1, dtype=torch.float64)
    params = per_row(B, temperature, top_k, 0.9, device=device)
    out = check_against_reference(logits, drafts, params, uniforms=uniforms, device=device)
    greedy = temperature == 0
    best = logits.argmax(-1)
    for b in torch.nonzero(greedy).flatten().tolist():  # greedy rows: drafts then argmax
        n = int(out.num_accepted[b])
        assert out.tokens[b, n].item() == best[b, n].item()


GRID = [  # (B, K, V): B 1/3/17, K 1/16, V 111/20,000/151,936
    (1, 1, 111), (3, 16, 111), (17, 1, 111), (17, 16, 111), (3, 1, 20000), (17, 16, 20000),
    (1, 16, 151936), (3, 1, 151936),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,K,V", GRID)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verify_grid_matches_reference(device, B, K, V, temperature):
    logits, drafts = random_case(B, K, V, accept_frac=0.9, gen_seed=B * K)
    if temperature > 0:  # make drafts likely enough to be accepted at T = 1
        logits[torch.arange(B)[:, None], torch.arange(K)[None, :], drafts] += 8.0
    uniforms = torch.rand(B, K + 1, dtype=torch.float64)
    check_against_reference(logits, drafts, per_row(B, temperature, device=device), uniforms=uniforms,
                            device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("filters", [(0, 1.0), (7, 1.0), (0, 0.8), (20, 0.7)])
def test_verify_low_precision_logits_and_filters(device, dtype, filters):
    B, K, V = 5, 3, 2000
    logits, drafts = random_case(B, K, V, dtype=dtype, scale=2.0, gen_seed=5)
    params = per_row(B, 0.8, filters[0], filters[1], device=device)
    check_against_reference(logits, drafts, params, uniforms=torch.rand(B, K + 1, dtype=torch.float64),
                            device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 12, 0.95), (1.3, 0, 0.5)])
def test_verify_philox_coins_match_reference(device, temperature, top_k, top_p):
    B, K, V = 17, 6, 300
    logits, drafts = random_case(B, K, V, scale=2.0, gen_seed=7)
    logits[torch.arange(B)[:, None], torch.arange(K)[None, :], drafts] += 3.0
    check_against_reference(logits, drafts, per_row(B, temperature, top_k, top_p, device=device),
                            device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_verify_draft_probs_match_reference(device):
    B, K, V = 17, 4, 500
    logits, _ = random_case(B, K, V, scale=1.0, gen_seed=9)
    q = torch.softmax(logits[:, :K] + torch.randn(B, K, V) * 0.7, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1).reshape(B, K)
    for top_k, top_p in [(0, 1.0), (50, 0.9)]:
        check_against_reference(logits, drafts, per_row(B, 1.0, top_k, top_p, device=device), draft_probs=q,
                                uniforms=torch.rand(B, K + 1, dtype=torch.float64), device=device)
        check_against_reference(logits, drafts, per_row(B, 1.0, top_k, top_p, device=device), draft_probs=q,
                                device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_verify_non_contiguous_logits(device):
    B, K, V = 3, 4, 333
    big, drafts = random_case(B, K + 1, V + 17, gen_seed=3)
    logits = big[:, 1:, 5:V + 5]                    # row strides not (K+1)*V, V
    t_major = big.transpose(0, 1).contiguous().transpose(0, 1)[:, :K + 1, :V]  # batch-minor layout
    for lg in (logits, t_major):
        assert not lg.is_contiguous()
        d = drafts[:, :K]
        u = torch.rand(B, K + 1, dtype=torch.float64)
        check_against_reference(lg, d, per_row(B, 1.0, device=device), uniforms=u, device=device)
        check_against_reference(lg, d, per_row(B, 0.0, device=device), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_sample_is_verify_with_k0(device):
    """ops.sample is verify with K = 0 on the same device (one kernel: identical by construction), and
    matches the float64 reference on every row whose coin or top-p cut is not within FRAGILE of its
    threshold — fp32 kernels (CPU or CUDA, different exp and summation order) may differ only there."""
    B, V = 17, 1000
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0)) * 2
    greedy = ops.sample(logits.to(device))
    assert greedy.cpu().tolist() == logits.argmax(-1).tolist()
    params = per_row(B, 0.7, 40, 0.9)
    on_device = {k: v.to(device) for k, v in params.items()}
    got = ops.sample(logits.to(device), **on_device).cpu()
    empty = torch.empty(B, 0, dtype=torch.int64)
    assert torch.equal(got, ops.verify(logits[:, None].to(device), empty.to(device), **on_device).tokens[:, 0].cpu())
    coins = torch.tensor([[verify_uniform(int(s), int(p), 1)] for s, p in zip(params["seed"], params["position"])],
                         dtype=torch.float64)  # K = 0 draws its token from the RESAMPLE stream
    for uniforms in (None, coins):
        tokens, _, _, margin = verify_reference_detailed(logits[:, None], empty, **params, uniforms=uniforms)
        solid = margin >= FRAGILE
        assert solid.sum() >= B - 2, f"too many fragile rows for this seed: {int((~solid).sum())}"
        assert got[solid].tolist() == tokens[solid, 0].tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [200, 5000])  # sorted (small V) and radix (large V) threshold paths
@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.5), (40, 0.3), (1, 1.0)])
def test_verify_filters_keep_ties_at_threshold(device, V, top_k, top_p):
    B, K = 9, 2
    g = torch.Generator().manual_seed(V + top_k)
    logits = torch.randint(0, 6, (B, K + 1, V), generator=g).float()  # integer logits: many ties
    drafts = torch.randint(0, V, (B, K), generator=g)
    for temperature in (0.5, 1.0):
        check_against_reference(logits, drafts, per_row(B, temperature, top_k, top_p, device=device),
                                uniforms=torch.rand(B, K + 1, dtype=torch.float64, generator=g), device=device)


def test_sample_argument_errors_name_sample():
    from flashmap_ext.ops import sample
    with pytest.raises(ValueError, match=r"sample: logits must be a \[B, V\] tensor"):
        sample(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match="sample: logits must be bf16, fp16 or fp32"):
        sample(torch.zeros(2, 5, dtype=torch.int64))
    # the checks `sample` shares with `verify` named verify and its target_logits
    with pytest.raises(ValueError, match=r"^sample: temperature must be finite and >= 0"):
        sample(torch.zeros(2, 5), temperature=-0.5)
    with pytest.raises(ValueError, match=r"^sample: position must be a python scalar or a \[B\] = \[2\] tensor"):
        sample(torch.zeros(2, 5), position=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"^sample: logits rows \[1\] hold NaN"):
        sample(torch.tensor([[0.0, 1.0], [math.nan, 0.0]]), temperature=1.0, position=0)
    with pytest.raises(ValueError, match=r"^sample: logits \[B, V\] needs B >= 1 and V >= 1, got \[0, 5\]"):
        sample(torch.zeros(0, 5))
