"""verify: edge cases of DESIGN.md §3.1 — zero-probability drafts,
q = p, degenerate residuals, invalid drafts, padded vocabulary, non-finite logits, tiny temperature,
batch invariance of the coins, argument errors."""
import math

import pytest
import torch

from flashmap_ext import ops
from flashmap_ext.ops.verify_reference import verify_reference
from support.verify_helpers import DEVICES, check_against_reference, per_row, random_case

NEG = -math.inf


def _verify(device, logits, drafts, **kw):
    """ops.verify on `device`; one call per case, so its coins' position is 0 unless given."""
    kw.setdefault("position", 0)
    move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v
    return ops.verify(move(logits), move(drafts), **{k: move(v) for k, v in kw.items()})


@pytest.mark.parametrize("device", DEVICES)
def test_verify_zero_probability_draft_rejected_with_zero_coin(device):
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])  # top_k=2 removes id 3
    out = _verify(device, logits, torch.tensor([[3]]), temperature=1.0, top_k=2,
                  uniforms=torch.tensor([[0.0, 0.0]], dtype=torch.float64))
    assert out.num_accepted.item() == 0
    assert out.tokens[0, 0].item() == 0  # u = 0 picks the first id of the residual (= p)
    out = _verify(device, logits, torch.tensor([[2]]), temperature=1.0, top_k=2,  # also outside top-k
                  uniforms=torch.tensor([[0.0, 0.999]], dtype=torch.float64))
    assert out.num_accepted.item() == 0 and out.tokens[0, 0].item() == 1


@pytest.mark.parametrize("device", DEVICES)
def test_verify_q_equals_p_never_rejects(device):
    B, K, V = 64, 3, 8
    logits = torch.full((B, K + 1, V), NEG)
    logits[..., :4] = 0.0                                   # p uniform on 4 ids: exact in fp32
    drafts = torch.randint(0, 4, (B, K))
    q = torch.zeros(B, K, V)
    q[..., :4] = 0.25
    u = torch.full((B, K + 1), 1.0 - 2.0**-24, dtype=torch.float64)  # largest possible coin
    for coins in (u, None):                                  # extreme injected coin, then Philox coins
        out = _verify(device, logits, drafts, temperature=1.0, draft_probs=q, uniforms=coins)
        assert out.num_accepted.cpu().tolist() == [K] * B
    onehot = torch.full((B, K + 1, V), NEG)
    onehot[..., 5] = 0.0                                    # p one-hot, point-mass draft on it
    out = _verify(device, onehot, torch.full((B, K), 5), temperature=1.0, uniforms=u)
    assert out.num_accepted.cpu().tolist() == [K] * B and (out.tokens.cpu() == 5).all()


@pytest.mark.parametrize("device", DEVICES)
def test_verify_zero_residual_falls_back_to_p(device):
    B, V = 200, 8
    logits = torch.full((B, 2, V), NEG)
    logits[..., :4] = 0.0
    q = torch.ones(B, 1, V)                                 # q >= p everywhere: max(p - q, 0) = 0
    drafts = torch.zeros(B, 1, dtype=torch.int64)
    out = check_against_reference(logits, drafts, per_row(B, 1.0, device=device), draft_probs=q, device=device)
    rejected = out.num_accepted.cpu() == 0
    assert rejected.any()
    assert ((out.status.cpu() & ops.STATUS_FALLBACK) != 0).tolist() == rejected.tolist()
    emitted = out.tokens[:, 0].cpu()[rejected]
    assert ((emitted >= 1) & (emitted <= 3)).all()          # p minus x: never x, never outside p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verify_invalid_draft_mid_block_rejects_rest(device, temperature):
    B, K, V = 4, 4, 50
    logits, _ = random_case(B, K, V, scale=1.0)
    best = logits.argmax(-1)
    logits[torch.arange(B)[:, None], torch.arange(K + 1)[None], best] += 30.0   # drafts surely accepted
    drafts = best[:, :K].clone()
    drafts[:, 2] = torch.tensor([-1, V, V + 1000, -7])      # none / id >= V / far out / negative
    out = check_against_reference(logits, drafts, per_row(B, temperature, device=device), device=device)
    assert out.num_accepted.cpu().tolist() == [2] * B
    assert out.tokens[:, 2].cpu().tolist() == best[:, 2].tolist()   # emitted from p (here its argmax)
    assert (out.tokens[:, 3:].cpu() == -1).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature,top_k", [(0.0, 0), (1.0, 0), (2.0, 3)])
def test_verify_padded_vocab_never_emitted(device, temperature, top_k):
    B, K, V, vv = 50, 3, 40, 30
    logits, drafts = random_case(B, K, V, scale=1.0)
    logits[..., vv:] = 50.0                                  # padding rows hold the largest logits
    drafts[:, 1] = vv + 2                                    # a draft in the padding: rejected
    out = check_against_reference(logits, drafts, per_row(B, temperature, top_k, device=device),
                                  valid_vocab=vv, device=device)
    tokens = out.tokens.cpu()
    assert ((tokens == -1) | ((tokens >= 0) & (tokens < vv))).all()
    assert (out.num_accepted.cpu() <= 1).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verify_nonfinite_logits_flagged_and_raised(device, temperature):
    B, K, V = 5, 2, 20000
    logits, drafts = random_case(B, K, V)
    logits[1, 2, 17] = math.nan                              # NaN in the last slot (maybe never reached)
    logits[2, 0, 19999] = math.inf
    logits[3, 1] = NEG                                       # a slot with no finite logit
    logits[4, 0, :5000] = NEG                                # -inf is a legal mask
    with pytest.raises(ValueError, match=r"rows \[1, 2, 3\]"):
        _verify(device, logits, drafts, temperature=temperature)
    out = _verify(device, logits, drafts, temperature=temperature, check=False)
    assert out.status.cpu().tolist() == [0, ops.STATUS_NONFINITE, ops.STATUS_NONFINITE, ops.STATUS_NO_FINITE, 0]
    tokens = out.tokens.cpu()
    assert ((tokens[1:4, 0] >= 0) & (tokens[1:4, 0] < V)).all() and (tokens[1:4, 1:] == -1).all()
    nan_row = torch.full((1, 1, 111), math.nan)              # all-NaN row: flagged, in-range token
    out = _verify(device, nan_row, torch.empty(1, 0, dtype=torch.int64), temperature=temperature, check=False)
    assert out.status.item() & ops.STATUS_NONFINITE and 0 <= out.tokens.item() < 111


@pytest.mark.parametrize("device", DEVICES)
def test_verify_invalid_draft_probs_flagged_and_raised(device):
    """q(x) at the drafted id of a sampling slot must be in (0, 1] (x was sampled from q): NaN, 0, negative,
    > 1 and inf flag the row with status bit 8 in any slot, even past the first rejection. The other
    entries of q are trusted (a NaN there weighs 0 in the residual, as in the reference); greedy rows
    never read q."""
    B, K, V = 7, 3, 50
    logits, _ = random_case(B, K, V, scale=1.0, gen_seed=4)
    q = torch.softmax(torch.randn(B, K, V, generator=torch.Generator().manual_seed(5)), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=torch.Generator().manual_seed(6)).reshape(B, K)
    for b, (i, value) in {1: (0, math.nan), 2: (1, 0.0), 3: (2, -0.25), 4: (0, 1.5), 5: (2, math.inf)}.items():
        q[b, i, drafts[b, i]] = value
    logits[6, 0, drafts[6, 0]] = -30.0                       # row 6 rejects slot 0 and samples the residual,
    q[6, 0, (drafts[6, 0] + 1) % V] = math.nan               # which reads a NaN q elsewhere: weight 0
    coins = torch.full((B, K + 1), 0.5, dtype=torch.float64)
    out = check_against_reference(logits, drafts, per_row(B, 1.0, device=device), draft_probs=q,
                                  uniforms=coins, device=device)
    assert out.status.cpu().tolist() == [0] + [ops.STATUS_BAD_DRAFT_PROB] * 5 + [0]
    assert out.tokens[1:6].cpu().tolist() == [[0, -1, -1, -1]] * 5 and out.num_accepted[1:6].cpu().eq(0).all()
    assert out.num_accepted[6].item() == 0 and out.tokens[6, 0].item() != (drafts[6, 0].item() + 1) % V
    with pytest.raises(ValueError, match=r"draft_probs rows \[1, 2, 3, 4, 5\] .* outside \(0, 1\]"):
        _verify(device, logits, drafts, temperature=1.0, draft_probs=q, uniforms=coins)
    greedy = _verify(device, logits, drafts, temperature=0.0, draft_probs=q)
    assert greedy.status.cpu().tolist() == [0] * B


@pytest.mark.parametrize("device", DEVICES)
def test_verify_row_params_outside_domain_flagged_by_the_op(device):
    """[B] temperature / top_k / top_p tensors are checked by the op itself (status bit 16, no host sync):
    on CUDA the wrapper raises from the status when check=True; CPU tensors raise before the op runs."""
    B, K, V = 8, 2, 40
    logits, drafts = random_case(B, K, V, gen_seed=8)
    params = per_row(B, torch.tensor([1.0, math.nan, 1.0, 1.0, 1.0, 0.0, -1.0, math.inf]),  # rows 6, 7: issue of
                     torch.tensor([0, 0, -3, 0, 0, 0, 0, 0]),                               # a
                     torch.tensor([0.9, 0.9, 0.9, 1.5, math.nan, -0.5, 0.9, 0.9]),          # greedy / uniform row
                     device=device)
    op = torch.ops.flashmap.verify.default
    status = op(logits.to(device), drafts.to(device), *params.values())[2]
    assert status.cpu().tolist() == [0] + [ops.STATUS_BAD_PARAMS] * 7
    cpu = {k: v.cpu() for k, v in params.items()}
    assert verify_reference(logits, drafts, **cpu)[2].tolist() == status.cpu().tolist()
    with pytest.raises(ValueError, match=r"temperature must be finite and >= 0 .* \[B\] = \[8\] float32 tensor; "
                                         r"rows \[1, 6, 7\] hold \[nan, -1.0, inf\]"):
        _verify(device, logits, drafts, **params)
    if device == "cuda":
        out = _verify(device, logits, drafts, **params, check=False)
        assert out.status.cpu().tolist() == status.cpu().tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_verify_tiny_temperature_is_finite_and_argmax_like(device):
    B, K, V = 6, 3, 1000
    logits, drafts = random_case(B, K, V, scale=2.0)
    for t in (1e-6, 1e-30, 1e-45):
        out = _verify(device, logits, drafts, temperature=t, seed=torch.arange(B))
        greedy = _verify(device, logits, drafts, temperature=0.0)
        assert out.status.cpu().tolist() == [0] * B
        assert torch.equal(out.tokens.cpu(), greedy.tokens.cpu())  # unique maxima: p is one-hot


@pytest.mark.parametrize("device", DEVICES)
def test_verify_seeded_rows_independent_of_batch(device):
    B, K, V = 12, 5, 300
    logits, drafts = random_case(B, K, V, scale=1.5, accept_frac=0.5)
    params = per_row(B, 1.0, 0, 0.95)
    full = _verify(device, logits, drafts, **params)
    perm = torch.randperm(B)
    shuffled = _verify(device, logits[perm], drafts[perm], **{k: v[perm] for k, v in params.items()})
    assert torch.equal(shuffled.tokens.cpu(), full.tokens.cpu()[perm])
    mates = per_row(B, 0.0, 1, 0.5)                          # greedy/top-1 batch-mates
    for b in (0, 7):
        mixed = {k: torch.cat([mates[k][:3], params[k][b:b + 1], mates[k][3:]]) for k in params}
        lg = torch.cat([logits[:3], logits[b:b + 1], logits[3:]])
        dr = torch.cat([drafts[:3], drafts[b:b + 1], drafts[3:]])
        assert torch.equal(_verify(device, lg, dr, **mixed).tokens[3].cpu(), full.tokens[b].cpu())
    other = _verify(device, logits, drafts, **dict(params, seed=params["seed"] + 1))
    assert not torch.equal(other.tokens.cpu(), full.tokens.cpu())
    again = _verify(device, logits, drafts, **params)
    assert torch.equal(again.tokens.cpu(), full.tokens.cpu())


def test_verify_top_filters_equal_greedy_when_extreme():
    B, K, V = 20, 4, 500
    logits, drafts = random_case(B, K, V, scale=2.0)
    greedy = ops.verify(logits, drafts)
    for kw in (dict(top_k=1), dict(top_p=1e-9), dict(top_p=torch.zeros(B))):  # a scalar 0 is refused
        out = ops.verify(logits, drafts, temperature=1.0, seed=torch.arange(B), position=0, **kw)
        assert torch.equal(out.tokens, greedy.tokens), kw


@pytest.mark.parametrize("device", DEVICES)
def test_verify_argument_errors_name_the_argument(device):
    logits = torch.randn(2, 4, 10, device=device)
    drafts = torch.zeros(2, 3, dtype=torch.int64, device=device)
    cases = [
        (dict(draft_tokens=drafts[:, :2]), ValueError, r"draft_tokens must be \[B, K\] = \[2, 3\]"),
        (dict(draft_tokens=drafts.int()), TypeError, "draft_tokens must be int64"),
        (dict(target_logits=logits.double()), TypeError, "target_logits must be bf16, fp16 or fp32"),
        (dict(target_logits=logits[0]), ValueError, r"target_logits must be a \[B, K\+1, V\]"),
        (dict(temperature=torch.ones(3, device=device)), ValueError, r"temperature must be .* \[B\] = \[2\]"),
        (dict(top_k=torch.ones(2, device=device)), TypeError, "top_k must be an integer tensor"),
        (dict(temperature=torch.tensor([0, 1], device=device)), TypeError,
         r"temperature must be a floating-point tensor \(got torch.int64\)"),
        (dict(draft_probs=torch.rand(2, 3, 9, device=device)), ValueError, r"draft_probs must be \[B, K, V\]"),
        (dict(draft_probs=torch.rand(2, 3, 10, device=device).double()), TypeError, "draft_probs must be float32"),
        (dict(uniforms=torch.rand(2, 3, device=device)), ValueError, r"uniforms must be \[B, K\+1\] = \[2, 4\]"),
        (dict(valid_vocab=11), ValueError, r"valid_vocab must be in \[1, V\]"),
    ]
    for change, error, message in cases:
        kw = dict(target_logits=logits, draft_tokens=drafts)
        kw.update(change)
        with pytest.raises(error, match=message):
            ops.verify(kw.pop("target_logits"), kw.pop("draft_tokens"), **kw)


def test_verify_op_checks_arguments_directly():
    """The C++ glue validates too (direct torch.ops calls bypass the wrapper)."""
    logits, drafts = torch.randn(2, 4, 10), torch.zeros(2, 3, dtype=torch.int64)
    p = per_row(2)
    op = torch.ops.flashmap.verify.default
    args = [logits, drafts, p["temperature"], p["top_k"], p["top_p"], p["seed"], p["position"]]
    with pytest.raises(ValueError, match=r"verify: draft_tokens must be \[B, K\] = \[2, 3\], got \[2, 2\]"):
        op(logits, drafts[:, :2], *args[2:])
    with pytest.raises(TypeError, match="verify: seed must be Long, got Int"):
        op(*args[:5], p["seed"].int(), p["position"])
    with pytest.raises(ValueError, match=r"verify: uniforms must be \[B, K\+1\] = \[2, 4\]"):
        op(*args, None, 0, torch.rand(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="valid_vocab must be <= V = 10"):
        op(*args, None, 11, None)
    assert op(*args)[0].shape == (2, 4)
    assert verify_reference(logits, drafts, **p)[0].shape == (2, 4)


@pytest.mark.cuda
def test_verify_cuda_graph_replay_matches_eager():
    """check=False never syncs: the op captures into a CUDA graph; replays follow in-place input changes."""
    B, K, V = 8, 4, 20000
    logits, drafts = random_case(B, K, V, dtype=torch.bfloat16)
    static = dict(logits=logits.cuda(), drafts=drafts.cuda(), seed=torch.arange(B, device="cuda"),
                  temperature=torch.tensor([0.0, 1.0] * 4, device="cuda"))
    run = lambda: ops.verify(static["logits"], static["drafts"], temperature=static["temperature"],
                             seed=static["seed"], position=7, top_p=0.9, check=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for step in range(3):
        new_logits, new_drafts = random_case(B, K, V, dtype=torch.bfloat16, gen_seed=step + 1)
        static["logits"].copy_(new_logits)
        static["drafts"].copy_(new_drafts)
        static["seed"].add_(B)
        graph.replay()
        eager = run()
        for got, expected in zip(captured, eager):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset,V", [(0, 4096 + 77), (1, 4096), (3, 999)])
def test_verify_rows_at_any_alignment_and_a_partial_last_tile(device, dtype, offset, V):
    """The CUDA sweep reads full 256-id tiles of 16-byte aligned rows as vectors and the rest scalar: rows
    shifted by `offset` elements (unaligned views) and a partial last tile give the reference's tokens."""
    B, K = 3, 4
    logits, drafts = random_case(B, K, V + offset, dtype=dtype, gen_seed=V + offset)
    view = logits.to(device)[..., offset:]  # sliced on the device: rows start `offset` elements in
    drafts = drafts.clamp(max=V - 1)
    for temperature, top_k, top_p in ((0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 50, 0.9)):
        check_against_reference(view, drafts, per_row(B, temperature, top_k, top_p, device=device), device=device)
