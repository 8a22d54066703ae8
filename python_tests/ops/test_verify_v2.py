"""verify with FLASHMAP_VERIFY_KERNEL=v2: the slice decomposition (csrc/verify/verify_slices.h) compiled and
checked on the host, and the v2 kernels — the CPU twin here, the CUDA kernel on a GPU — against the float64
reference on the cases the decomposition makes special: argmax ties across slices and lanes, the last
partial chunk, NaN / +inf / −inf confined to one slice, residual samples landing in every slice, filters,
draft_probs, and a row's result when its batch (hence the CUDA cluster size) changes. Expected values come
from verify_reference, torch.argmax, exact distributions, or float64 sums, never from the kernels. The
whole verify suite also runs under the switch (benches/device_check.sh step verify_tests_v2)."""
import math
import subprocess

import numpy as np
import pytest
import torch

from flashmap_ext import ops
from support.cxx_helpers import build_driver
from support.verify_helpers import DEVICES, assert_chi_square, check_against_reference, per_row, random_case


@pytest.fixture
def v2(monkeypatch):
    monkeypatch.setenv("FLASHMAP_VERIFY_KERNEL", "v2")


# --- the plan, on the host ----------------------------------------------------------------------------------
DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include "verify/verify_slices.h"
using namespace flashmap;
int main(int argc, char** argv) {
  if (!std::strcmp(argv[1], "slices")) {           // slices V: begin end span per slice
    const long long vv = atoll(argv[2]);
    for (int s = 0; s < kVerifySlices; ++s) {
      const SliceRange r = verify_slice_range(vv, s);
      std::printf("%lld %lld %lld\n", (long long)r.begin, (long long)r.end, (long long)verify_lane_span(vv));
    }
  } else if (!std::strcmp(argv[1], "cluster")) {   // cluster rows r1 r2 r4 r8
    const int64_t resident[4] = {atoll(argv[3]), atoll(argv[4]), atoll(argv[5]), atoll(argv[6])};
    std::printf("%d\n", verify_cluster_size(atoll(argv[2]), resident));
  } else if (!std::strcmp(argv[1], "resident")) {  // resident V cluster elem_bytes
    std::printf("%lld\n", (long long)verify_resident_bytes(atoll(argv[2]), atoi(argv[3]), atoi(argv[4])));
  } else {                                         // sums SEED: 256 values, their tree sum and lane scan
    std::mt19937 g(atoi(argv[2]));
    std::uniform_real_distribution<float> u(0.f, 1.f);
    float v[kVerifyLanes], t[kVerifyLanes];
    for (int i = 0; i < kVerifyLanes; ++i) v[i] = t[i] = u(g) * (i % 7 == 0 ? 1000.f : 1.f);
    for (int i = 0; i < kVerifyLanes; ++i) std::printf("%.9g ", v[i]);
    std::printf("\n%.9g\n", verify_tree_reduce(t, [](float a, float b) { return verify_add(a, b); }));
    verify_lane_scan(v);
    for (int i = 0; i < kVerifyLanes; ++i) std::printf("%.9g ", v[i]);
    std::printf("\n");
  }
}
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    exe = build_driver(tmp_path_factory, "verify_slices", DRIVER)
    return lambda *args: subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                                        check=True).stdout


@pytest.mark.parametrize("V", [1, 7, 8, 9, 63, 64, 2000, 4099, 151936])
def test_slices_cover_the_row_in_order(plan, V):
    rows = [list(map(int, line.split())) for line in plan("slices", V).splitlines()]
    chunks, per = -(-V // 8), -(-(-(-V // 8)) // 8)
    assert len(rows) == 8 and rows[0][0] == 0 and rows[-1][1] == chunks
    for (b0, e0, _), (b1, _, _) in zip(rows, rows[1:]):
        assert e0 == b1 and 0 <= e0 - b0 <= per
    span = rows[0][2]
    assert span * 256 >= per and (span - 1) * 256 < max(per, 1)  # the lanes' spans cover a slice, just


@pytest.mark.parametrize("rows,resident,expected", [
    (17, (264, 132, 66, 33), 8),     # B = 1, K = 16 on 132 SMs, 2 CTAs each: every row over 8 SMs
    (136, (264, 132, 66, 33), 1),    # B = 8: 136 rows exceed the 132 pairs: one CTA per row
    (60, (264, 132, 66, 33), 4),
    (33, (264, 132, 66, 0), 4),      # clusters of 8 that cannot be scheduled are never chosen
    (1088, (264, 132, 66, 33), 1),   # B = 64
])
def test_cluster_size_is_the_largest_that_fits_at_once(plan, rows, resident, expected):
    assert int(plan("cluster", rows, *resident)) == expected


def test_resident_slice_bytes(plan):
    assert int(plan("resident", 151936, 8, 2)) == 2374 * 8 * 2        # 18,992 bf16 ids of one slice
    assert int(plan("resident", 151936, 8, 4)) == 2374 * 8 * 4
    assert int(plan("resident", 151936, 4, 2)) == 0                   # two slices per CTA: not resident
    assert int(plan("resident", 10_000_000, 8, 4)) == 0               # over the budget


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_and_scan_match_float64_sums(plan, seed):
    lines = plan("sums", seed).splitlines()
    v = np.array(lines[0].split(), dtype=np.float64)
    assert abs(float(lines[1]) - v.sum()) <= 1e-6 * v.sum()
    scan = np.array(lines[2].split(), dtype=np.float64)
    assert np.allclose(scan, np.cumsum(v), rtol=2e-6, atol=0)


# --- the kernels vs the reference ---------------------------------------------------------------------------
def test_switch_names_the_variable_on_a_bad_value(monkeypatch):
    monkeypatch.setenv("FLASHMAP_VERIFY_KERNEL", "v3")
    with pytest.raises(ValueError, match=r"FLASHMAP_VERIFY_KERNEL must be v1 \(the default\) or v2, got 'v3'"):
        ops.verify(torch.zeros(1, 2, 5), torch.zeros(1, 1, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_ties_across_slices_and_lanes_take_the_lowest_id(v2, device, dtype):
    V = 4099  # 513 chunks: 65 per slice, the last chunk partial
    logits = torch.randn(6, 2, V, generator=torch.Generator().manual_seed(1)).to(dtype)
    logits[0, :, [100, 3000, 4098]] = 9.0       # slices 0, 5 and the last partial chunk
    logits[1, :, [4098]] = 9.0                  # only the very last id
    logits[2, :, [8 * 300 + 7, 8 * 300 + 2]] = 9.0  # one chunk: its lowest id
    logits[3, :, [8 * 65, 8 * (65 + 256)]] = 9.0    # the same lane of slice 1, two of its chunks
    logits[4] = 0.0                             # every id ties: id 0
    logits[5, :, [8 * 64 + 7, 8 * 65]] = 9.0    # the last id of slice 0, the first of slice 1
    drafts = logits[:, 0].float().argmax(-1, keepdim=True)
    out = ops.verify(logits.to(device), drafts.to(device))
    expected = logits[:, 1].float().argmax(-1)  # torch.argmax: lowest id on ties
    assert out.num_accepted.cpu().tolist() == [1] * 6
    assert out.tokens[:, 1].cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [5, 37, 4099, 151936])
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.4])
def test_v2_matches_reference(v2, device, V, temperature):
    B, K = (3, 4) if V < 100_000 else (2, 3)
    logits, drafts = random_case(B, K, V, accept_frac=0.8, gen_seed=V + 1)
    if temperature > 0:
        logits[torch.arange(B)[:, None], torch.arange(K)[None, :], drafts] += 6.0
    check_against_reference(logits, drafts, per_row(B, temperature, device=device),
                            uniforms=torch.rand(B, K + 1, dtype=torch.float64,
                                                generator=torch.Generator().manual_seed(V)),
                            device=device, max_fragile=0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_residual_samples_land_in_every_slice(v2, device):
    """Flat logits, so the resample coin u picks id ≈ u·V: u = (s + 0.5) / 8 lands in slice s, and the
    ends of the row (u = 0 and u just below 1) in the first and last ids."""
    V, K = 2048, 1
    coins = [(s + 0.5) / 8 for s in range(8)] + [0.0, 1 - 2**-24]
    B = len(coins)
    logits = torch.zeros(B, K + 1, V)
    drafts = torch.full((B, K), 5)
    uniforms = torch.tensor([[0.999, u] for u in coins], dtype=torch.float64)  # slot 0 rejects its draft
    out = check_against_reference(logits, drafts, per_row(B, 1.0, device=device), uniforms=uniforms,
                                  device=device, max_fragile=0.2)  # the two end coins sit on a boundary
    assert out.tokens[:, 0].cpu().tolist()[-2:] == [0, V - 1]


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_logits_in_one_slice_set_the_status(v2, device):
    V, K = 4096, 2
    logits = torch.randn(4, K + 1, V, generator=torch.Generator().manual_seed(2))
    logits[0, 1, 3000] = math.nan                # slice 5 of slot 1 only
    logits[1, 2, 10] = math.inf                  # slice 0 of slot 2
    logits[2, 0, :2048] = -math.inf              # half the row: still finite values
    logits[3, 1] = -math.inf                     # no finite value in slot 1
    logits[3, 1, 4095] = math.inf                # ... but a +inf: both bits
    drafts = logits[:, :K].argmax(-1)
    for temperature in (0.0, 1.0):
        check_against_reference(logits, drafts, per_row(4, temperature, device=device),
                                uniforms=torch.rand(4, K + 1, dtype=torch.float64), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.6), (40, 0.8), (1, 1.0)])
def test_v2_filters_match_reference(v2, device, top_k, top_p):
    B, K, V = 5, 2, 3000
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randint(0, 8, (B, K + 1, V), generator=g).float() * 0.5  # many ties at the thresholds
    drafts = torch.randint(0, V, (B, K), generator=g)
    check_against_reference(logits, drafts, per_row(B, 0.7, top_k, top_p, device=device),
                            uniforms=torch.rand(B, K + 1, dtype=torch.float64, generator=g), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_v2_draft_probs_match_reference(v2, device):
    B, K, V = 6, 3, 1500
    logits, _ = random_case(B, K, V, scale=1.0, gen_seed=4)
    q = torch.softmax(logits[:, :K] + torch.randn(B, K, V) * 0.5, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1).reshape(B, K)
    check_against_reference(logits, drafts, per_row(B, 1.0, 0, 0.9, device=device), draft_probs=q,
                            uniforms=torch.rand(B, K + 1, dtype=torch.float64), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_result_does_not_depend_on_its_batch(v2, device):
    """Alone (B = 1: on CUDA a cluster of 8 CTAs per row) and inside a batch of 64 (one CTA per row), the
    same row with the same seed and position gives the same tokens, bit for bit: the reduction tree is
    fixed by V alone."""
    K, V = 16, 151936 if device == "cuda" else 20000
    logits, drafts = random_case(64, K, V, scale=2.0, gen_seed=11)
    logits = logits.to(device, torch.bfloat16)
    drafts = drafts.to(device)
    params = per_row(64, 1.0, device=device)
    whole = ops.verify(logits, drafts, **params, check=False)
    for b in (0, 37):
        one = ops.verify(logits[b:b + 1], drafts[b:b + 1], **{k: v[b:b + 1] for k, v in params.items()},
                         check=False)
        assert one.tokens.tolist() == whole.tokens[b:b + 1].tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_v2_samples_follow_p_minus_the_draft(v2, device):
    """K = 1 point-mass draft x with p(x) ≈ 0.6 and Philox coins over 3,000 seeds: slot 0 emits x with
    probability p(x) and otherwise a sample of p with x removed, so the emitted token's law is exactly p."""
    V, N = 300, 3000
    logits = torch.randn(1, 2, V, generator=torch.Generator().manual_seed(5)) * 1.5
    logits[0, 0, 17] = logits[0, 0].max() + 3.0
    p = torch.softmax(logits[0, 0].double(), -1).numpy()
    out = ops.verify(logits.expand(N, 2, V).contiguous().to(device), torch.full((N, 1), 17, device=device),
                     temperature=1.0, seed=torch.arange(N, device=device), position=7)
    counts = np.bincount(out.tokens[:, 0].cpu().numpy(), minlength=V)
    assert_chi_square(counts, p, "v2 slot 0 tokens")
