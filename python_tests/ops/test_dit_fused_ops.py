"""The fused DiT ops (flashmap_ext.ops.dit_fused; FLASHMAP_DIT_FUSED_NORMS): opcheck, the CPU twins against the
float64 references chained (dit_reference.norm_linear / linear_kv_append) under the error budget of the
DiT op tests, against the unfused CPU ops (the same rounding points, so bit for bit), clear argument errors,
and on a GPU the CUDA kernels (adaLN prologue, head-norm and cache-append epilogues) at the drafter's shapes:
within the budget and bit for bit the unfused CUDA kernels, whose rounding points and reductions they share.
The fused draft step built from them: python_tests/drafters/test_fused_norms.py."""
import pytest
import torch
from test_dit_ops import assert_within_budget, check, lens, randn

from flashmap_ext.ops import dit as ops
from flashmap_ext.ops import dit_fused as fops
from flashmap_ext.ops import dit_reference as ref

OPS = torch.ops.flashmap


# ------------------------------------------------------------------ inputs
def norm_linear_args(M, K, heads, D, G, groups, device, dtype, seed=0):
    """x [M, K], the [groups * heads * D + extra, K] weight and bias, adaLN shift/scale [G, K], q/k norms [D]."""
    N = groups * heads * D + (heads * D if groups == 2 else 0)  # a qkv layout leaves the values un-normed
    r = lambda *s, scale=1.0, k=0: randn(*s, device=device, dtype=dtype, scale=scale, seed=seed + k)
    return dict(x=r(M, K, scale=3), weight=r(N, K, scale=K ** -0.5, k=1), bias=r(N, k=2), shift=r(G, K, k=3),
                scale=r(G, K, scale=0.5, k=4), q_norm=r(D, k=5), k_norm=r(D, k=6) if groups == 2 else None,
                heads=heads)


def kv_append_args(layers, B, T, L, H, D, K, device, dtype):
    r = lambda *s, scale=1.0, k=0: randn(*s, device=device, dtype=dtype, scale=scale, seed=k)
    return dict(k_cache=r(layers, B, L, H, D, k=1), v_cache=r(layers, B, L, H, D, k=2), x=r(B, T, K, scale=3, k=3),
                weight=r(layers * 2 * H * D, K, scale=K ** -0.5, k=4), bias=r(layers * 2 * H * D, k=5),
                k_norm=r(layers, D, k=6))


def call_norm_linear(a, *, adaln=True, activation="none", positions=None, norms=True, theta=1e6):
    extra = dict(shift=a["shift"], scale=a["scale"]) if adaln else {}
    if norms:
        extra.update(q_norm=a["q_norm"], k_norm=a["k_norm"], heads=a["heads"], positions=positions, theta=theta)
    return fops.norm_linear(a["x"], a["weight"], a["bias"], activation=activation, **extra)


def reference_norm_linear(a, *, adaln=True, activation="none", positions=None, norms=True, theta=1e6,
                          dtype=torch.float64):
    extra = dict(shift=a["shift"], scale=a["scale"]) if adaln else {}
    if norms:
        extra.update(q_norm=a["q_norm"], k_norm=a["k_norm"], heads=a["heads"], positions=positions, theta=theta)
    return ref.norm_linear(a["x"], a["weight"], a["bias"], activation, dtype=dtype, **extra)


def unfused_norm_linear(a, *, adaln=True, activation="none", positions=None, norms=True, theta=1e6):
    """The chain of unfused ops the fused one replaces."""
    h = ops.adaln(a["x"], a["shift"], a["scale"]) if adaln else a["x"]
    y = ops.linear(h, a["weight"], a["bias"], activation=activation)
    if not norms:
        return y
    D, heads = a["q_norm"].shape[0], a["heads"]
    parts = [ops.rms_norm(y[:, i * heads * D:(i + 1) * heads * D].reshape(-1, heads, D), w, positions, theta=theta)
             .reshape(y.shape[0], heads * D) for i, w in enumerate(w for w in (a["q_norm"], a["k_norm"]) if w is not None)]
    return torch.cat(parts + [y[:, len(parts) * heads * D:]], dim=1)


def positions_for(M, device, seed=0):
    return torch.randint(0, 5000, (M,), generator=torch.Generator().manual_seed(seed)).to(device)


VARIANTS = [  # (adaln, norms, k_norm groups, rope, activation): qkv, cross q, fc1/final, a q norm without adaLN
    (True, True, 2, False, "none"), (True, True, 1, True, "none"), (True, False, 1, False, "gelu_tanh"),
    (False, True, 1, True, "none")]


# ------------------------------------------------------------------ opcheck, CPU twins
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_ops_opcheck_cpu(dtype):
    a = norm_linear_args(6, 64, 2, 16, 3, 2, "cpu", dtype)
    pos = positions_for(6, "cpu")
    torch.library.opcheck(OPS.dit_norm_linear.default, (a["x"], a["weight"], a["bias"], "gelu_tanh", a["shift"],
                                                        a["scale"], 1e-6, a["q_norm"], a["k_norm"], 2, pos, 1e4, 1e-6))
    torch.library.opcheck(OPS.dit_norm_linear.default, (a["x"], a["weight"], None, "none", None, None, 1e-6, None,
                                                        None, 0, None, 1e4, 1e-6))
    k = kv_append_args(2, 2, 3, 8, 2, 16, 64, "cpu", dtype)
    torch.library.opcheck(OPS.dit_linear_kv_append.default,
                          (k["k_cache"], k["v_cache"], k["x"], k["weight"], k["bias"], k["k_norm"], lens([5, -1], "cpu"),
                           lens([3, 2], "cpu"), 1e4, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adaln,norms,groups,rope,activation", VARIANTS)
@pytest.mark.parametrize("M,K,heads,D,G", [(16, 64, 2, 32, 1), (48, 128, 3, 16, 3), (5, 64, 1, 64, 5), (0, 64, 2, 8, 1)])
def test_norm_linear_cpu_matches_the_chained_references(M, K, heads, D, G, adaln, norms, groups, rope, activation,
                                                         dtype):
    a = norm_linear_args(M, K, heads, D, G, groups, "cpu", dtype)
    kw = dict(adaln=adaln, norms=norms, activation=activation, positions=positions_for(M, "cpu") if rope else None)
    out = call_norm_linear(a, **kw)
    # fp32 RoPE angles carry ~pos·2^-24 rad (as test_rms_norm_cpu_matches_reference): fp32 against the fp32
    # chain, bf16 against the fp64 chain under the budget of the bf16 chain.
    oracle = reference_norm_linear(a, **kw, dtype=torch.float64 if dtype == torch.bfloat16 else torch.float32)
    check(out, oracle.double(), lambda: reference_norm_linear(a, **kw, dtype=dtype), dtype, "norm_linear")
    assert torch.equal(out, unfused_norm_linear(a, **kw)), "the twin keeps the unfused chain's rounding points"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layers,B,T,L,H,D", [(2, 3, 1, 9, 2, 32), (3, 2, 17, 40, 4, 16), (1, 1, 5, 3, 1, 64)])
def test_linear_kv_append_cpu_matches_the_chained_references(layers, B, T, L, H, D, dtype):
    a = kv_append_args(layers, B, T, L, H, D, 64, "cpu", dtype)
    start, count = lens([L - 2, -1, 0][:B], "cpu"), lens([T, T, max(T - 2, 0)][:B], "cpu")  # rows off both ends
    rk, rv = ref.linear_kv_append(a["k_cache"], a["v_cache"], a["x"], a["weight"], a["bias"], a["k_norm"], start,
                                  count, 1e6, dtype=torch.float64 if dtype == torch.bfloat16 else torch.float32)
    lk, lv = ref.linear_kv_append(a["k_cache"], a["v_cache"], a["x"], a["weight"], a["bias"], a["k_norm"], start,
                                  count, 1e6, dtype=dtype)
    k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
    fops.linear_kv_append_(k_cache, v_cache, a["x"], a["weight"], a["bias"], a["k_norm"], start, count, theta=1e6)
    check(k_cache, rk.double(), lambda: lk, dtype, "appended keys")
    check(v_cache, rv.double(), lambda: lv, dtype, "appended values")
    rows = torch.arange(L)[None]
    written = (rows >= start[:, None]) & (rows < (start + torch.minimum(count, torch.tensor(T)))[:, None])  # [B, L]
    assert written.any() and not written.all()
    assert torch.equal(k_cache[:, ~written], a["k_cache"][:, ~written])  # every other row untouched
    assert torch.equal(v_cache[:, ~written], a["v_cache"][:, ~written])


def test_linear_kv_append_cpu_equals_the_unfused_writes():
    a = kv_append_args(2, 2, 5, 12, 2, 32, 64, "cpu", torch.bfloat16)
    start, count = lens([3, 9], "cpu"), lens([5, 5], "cpu")
    k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
    fops.linear_kv_append_(k_cache, v_cache, a["x"], a["weight"], a["bias"], a["k_norm"], start, count)
    kv = ops.linear(a["x"], a["weight"], a["bias"]).view(2, 5, 2, 2, 2, 32)
    pos = start.long()[:, None] + torch.arange(5)
    for layer in range(2):
        ops.kv_append_(a["k_cache"][layer], ops.rms_norm(kv[:, :, layer, 0], a["k_norm"][layer], pos), start, count)
        ops.kv_append_(a["v_cache"][layer], kv[:, :, layer, 1], start, count)
    assert torch.equal(k_cache, a["k_cache"]) and torch.equal(v_cache, a["v_cache"])


@pytest.mark.parametrize("call,error,words", [
    (lambda a: fops.norm_linear(a["x"], a["weight"], shift=a["shift"]), ValueError, "shift and scale"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], k_norm=a["k_norm"], heads=2), ValueError, "k_norm needs q_norm"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], q_norm=a["q_norm"], heads=9), ValueError, "heads"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], positions=torch.arange(6)), ValueError, "positions"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], q_norm=a["q_norm"], heads=1, positions=torch.arange(5)),
     ValueError, "positions"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], q_norm=a["q_norm"].double(), heads=1), TypeError, "q_norm"),
    (lambda a: fops.norm_linear(a["x"], a["weight"], shift=a["shift"][:, :8], scale=a["scale"][:, :8]), ValueError,
     "shift"),
])
def test_norm_linear_errors_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call(norm_linear_args(6, 64, 2, 16, 3, 2, "cpu", torch.float32))


@pytest.mark.parametrize("change,error,words", [
    (dict(k_norm=randn(2, 8)), ValueError, "k_norm"),
    (dict(v_cache=randn(2, 2, 9, 2, 16)), ValueError, "v_cache"),
    (dict(weight=randn(128, 32)), ValueError, "weight"),
    (dict(weight=randn(96, 64), bias=None), ValueError, "n_layers"),
    (dict(x=randn(3, 4, 64)), ValueError, "x"),
    (dict(start=torch.zeros(2, dtype=torch.int64)), TypeError, "start"),
    (dict(count=lens([1], "cpu")), ValueError, "count")])
def test_linear_kv_append_errors_name_the_argument(change, error, words):
    a = {**kv_append_args(2, 2, 4, 8, 2, 16, 64, "cpu", torch.float32), "start": lens([0, 1], "cpu"),
         "count": lens([4, 4], "cpu"), **change}
    with pytest.raises(error, match=words):
        fops.linear_kv_append_(a["k_cache"], a["v_cache"], a["x"], a["weight"], a["bias"], a["k_norm"], a["start"],
                               a["count"])


# ------------------------------------------------------------------ CUDA kernels (bf16) at the drafter's shapes
def cuda_cases(*cases):
    return [pytest.param("cuda", *c, marks=pytest.mark.cuda) for c in cases]


@pytest.mark.parametrize("adaln,norms,groups,rope,activation", VARIANTS)
@pytest.mark.parametrize("device,M,K,heads,D,G", [("cpu", 5, 64, 2, 32, 5)] + cuda_cases(
    (16, 2048, 16, 128, 1), (48, 896, 14, 64, 3), (17, 1024, 8, 128, 17), (64, 4096, 32, 128, 4),
    (100, 2048, 16, 128, 1), (3, 2048, 16, 128, 3)))  # 3 rows: fewer than a cluster's ranks
def test_norm_linear_within_budget_and_equal_to_the_unfused_ops(device, M, K, heads, D, G, adaln, norms, groups,
                                                                 rope, activation):
    a = norm_linear_args(M, K, heads, D, G, groups, device, torch.bfloat16)
    kw = dict(adaln=adaln, norms=norms, activation=activation, positions=positions_for(M, device) if rope else None)
    out = call_norm_linear(a, **kw)
    assert_within_budget(out, reference_norm_linear(a, **kw),
                         reference_norm_linear(a, **kw, dtype=torch.bfloat16), "norm_linear")
    assert torch.equal(out, unfused_norm_linear(a, **kw)), "fused != the unfused kernels"


@pytest.mark.parametrize("device,layers,B,T,L,H,D,K", [("cpu", 2, 2, 3, 8, 2, 32, 64)] + cuda_cases(
    (6, 1, 1, 1100, 16, 128, 2048), (6, 4, 1, 300, 16, 128, 2048), (2, 3, 97, 128, 14, 64, 896),
    (3, 2, 17, 64, 16, 128, 2048)))
def test_linear_kv_append_within_budget_and_equal_to_the_unfused_ops(device, layers, B, T, L, H, D, K):
    a = kv_append_args(layers, B, T, L, H, D, K, device, torch.bfloat16)
    start = lens([L - 1 - T // 2, 0, 5, -2][:B], device)  # the first row runs past the cache end
    count = lens([T, max(T - 1, 1), T, T][:B], device)
    rk, rv = ref.linear_kv_append(a["k_cache"], a["v_cache"], a["x"], a["weight"], a["bias"], a["k_norm"], start,
                                  count, 1e6)
    lk, lv = ref.linear_kv_append(a["k_cache"], a["v_cache"], a["x"], a["weight"], a["bias"], a["k_norm"], start,
                                  count, 1e6, dtype=torch.bfloat16)
    k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
    fops.linear_kv_append_(k_cache, v_cache, a["x"], a["weight"], a["bias"], a["k_norm"], start, count, theta=1e6)
    assert_within_budget(k_cache, rk, lk, "appended keys")
    assert_within_budget(v_cache, rv, lv, "appended values")
    kv = ops.linear(a["x"], a["weight"], a["bias"]).view(B, T, layers, 2, H, D)
    pos = start.long()[:, None] + torch.arange(T, device=device)
    for layer in range(layers):
        ops.kv_append_(a["k_cache"][layer], ops.rms_norm(kv[:, :, layer, 0], a["k_norm"][layer], pos, theta=1e6),
                       start, count)
        ops.kv_append_(a["v_cache"][layer], kv[:, :, layer, 1], start, count)
    assert torch.equal(k_cache, a["k_cache"]) and torch.equal(v_cache, a["v_cache"]), "fused != the unfused kernels"


@pytest.mark.cuda
def test_fused_ops_opcheck_cuda():
    a = norm_linear_args(16, 128, 2, 64, 1, 2, "cuda", torch.bfloat16)
    torch.library.opcheck(OPS.dit_norm_linear.default, (a["x"], a["weight"], a["bias"], "none", a["shift"], a["scale"],
                                                        1e-6, a["q_norm"], a["k_norm"], 2, None, 1e4, 1e-6))
    k = kv_append_args(2, 2, 3, 8, 2, 64, 128, "cuda", torch.bfloat16)
    torch.library.opcheck(OPS.dit_linear_kv_append.default,
                          (k["k_cache"], k["v_cache"], k["x"], k["weight"], k["bias"], k["k_norm"],
                           lens([5, -1], "cuda"), lens([3, 2], "cuda"), 1e4, 1e-6))
