"""verify: statistical losslessness (fixed seeds, deterministic; design after vLLM's Model Runner V2
rejection-sampler tests).

Trials are batch rows: 200,000 rows in one call, V = 16, seeds 0..N-1, so each test takes seconds.
Per-position chi-square of the emitted token against the exact filtered target distribution (float64
reference filter), bins with expected count < 5 merged, pass iff chi2 < df + 10·sqrt(2·df). Drafts are
drawn from q = softmax(−target logits) with torch's generator (independent of the verifier's Philox
coins), so most are rejected (50–97% per slot) and the residual path dominates. Slots before the
tested one are made certain accepts (target one-hot on the draft), so every trial reaches it. A
prefix-conditioned Markov test checks the joint law of the first three committed tokens when target
rows depend on the draft prefix.

Mutation check (2026-11-30, CPU kernel csrc/verify/verify_cpu.cpp, each bug introduced alone, rebuilt,
this module and test_verify_exact/edge run, then reverted; run again after the kernel's
restructuring into one thread per slot, with the same counts):
  1. the residual sample reuses the slot's accept coin instead of the RESAMPLE coin:
     9 of this module's 10 tests fail (all but T=1/top-k 6/top-p 0.8 with draft_probs), and 31 of
     test_verify_exact/edge (exact mismatches with the reference).
  2. the residual is read from slot 0's logits instead of the rejected slot's (flashinfer #425):
     10 of 10 fail here (slots 2 and K, and the Markov joint law), and 18 exact/edge tests.
  3. no renormalisation of the residual (inverse CDF against u·S instead of u·R):
     10 of 10 fail here, and 24 exact/edge tests.
The unmutated kernel passes everything.
"""
import math

import numpy as np
import pytest
import torch

from flashmap_ext import ops
from flashmap_ext.ops.verify_reference import verify_target_probs
from support.verify_helpers import DEVICES, assert_chi_square

N, V, K = 200_000, 16, 3
FILTERS = [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 6, 0.8), (0.6, 10, 0.9)]  # (temperature, top_k, top_p)


def _setup(slot, seed=1):
    """Logits [N, K+1, V] and drafts [N, K] whose slots before `slot` are surely accepted (target
    one-hot on the draft), so every trial reaches `slot`, where the target is t (float64 -> fp32) and
    the draft comes from q = softmax(−t) (adversarial: most drafts are rejected)."""
    g = torch.Generator().manual_seed(seed + slot)
    t = torch.randn(V, generator=g, dtype=torch.float64).float()
    q = torch.softmax(-t.double(), -1)
    drafts = torch.multinomial(q.float(), N * K, replacement=True, generator=g).reshape(N, K)
    logits = t.repeat(N, K + 1, 1)
    forced = torch.full((N, slot, V), -math.inf).scatter_(2, drafts[:, :slot, None], 0.0)
    logits[:, :slot] = forced
    return logits, drafts, t, q


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_q", [False, True], ids=["point_mass", "draft_probs"])
@pytest.mark.parametrize("temperature,top_k,top_p", FILTERS)
def test_verify_emitted_tokens_follow_target(device, use_q, temperature, top_k, top_p):
    for slot in (0, 2, K):  # first slot, a slot after accepted drafts, the bonus slot
        logits, drafts, t, q = _setup(slot)
        dp = q.float().to(device).expand(N, K, V) if use_q else None
        out = ops.verify(logits.to(device), drafts.to(device), temperature=temperature, top_k=top_k,
                         top_p=top_p, seed=torch.arange(N, device=device), position=5, draft_probs=dp)
        tokens, num_acc = out.tokens.cpu().numpy(), out.num_accepted.cpu().numpy()
        assert (num_acc >= slot).all()
        p = verify_target_probs(t, temperature, top_k, top_p, V).numpy()
        assert_chi_square(np.bincount(tokens[:, slot], minlength=V), p, f"slot {slot}")
        if slot < K:  # acceptance at the slot: Σ q·p (point mass) or Σ min(p, q)
            qn = q.numpy()
            rate = (np.minimum(p, qn) if use_q else qn * p).sum()
            acc = (num_acc > slot).mean()
            assert abs(acc - rate) < 5 * math.sqrt(rate * (1 - rate) / N) + 1e-9, \
                f"slot {slot}: acceptance {acc:.4f} vs {rate:.4f}"
            assert acc < 0.9, "the residual path must be exercised"


def _markov_setup(Vm=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(torch.randn(Vm, Vm, generator=g, dtype=torch.float64) * 1.5, -1)  # P[prev, next]
    q = torch.softmax(torch.randn(K, Vm, generator=g, dtype=torch.float64), -1)           # prefix-blind drafter
    return P, q, g


def _markov_rollout(device, P, q, g, use_q, need=3):
    """Every row commits tokens round after round (anchor 0 first) until it holds `need` of them."""
    Vm = P.shape[0]
    committed = torch.zeros(N, need + K + 1, dtype=torch.int64)
    length = torch.zeros(N, dtype=torch.int64)
    logP = P.log().float()
    while int(length.min()) < need:
        anchor = torch.where(length > 0, committed.gather(1, (length - 1).clamp(min=0)[:, None])[:, 0], 0)
        drafts = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(K)], 1)
        prev = torch.cat([anchor[:, None], drafts], 1)                           # row i scores slot i
        out = ops.verify(logP[prev].to(device), drafts.to(device), temperature=1.0,
                         seed=torch.arange(N, device=device), position=length.to(device),
                         draft_probs=q.float()[None].expand(N, K, Vm).to(device) if use_q else None)
        tokens, n = out.tokens.cpu(), out.num_accepted.cpu().long() + 1
        cols = length[:, None] + torch.arange(K + 1)[None]
        keep = (torch.arange(K + 1)[None] < n[:, None]) & (cols < committed.shape[1])
        committed[torch.nonzero(keep)[:, 0], cols[keep]] = tokens[keep]
        length = torch.minimum(length + n, torch.tensor(committed.shape[1]))
    return committed[:, :need]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_q", [False, True], ids=["point_mass", "draft_probs"])
def test_verify_prefix_conditioned_joint_law(device, use_q):
    P, q, g = _markov_setup()
    Vm = P.shape[0]
    y = _markov_rollout(device, P, q, g, use_q).numpy()
    joint = P[0][:, None, None] * P[:, :, None] * P[None, :, :]               # P[0,a] P[a,b] P[b,c]
    observed = np.bincount((y[:, 0] * Vm + y[:, 1]) * Vm + y[:, 2], minlength=Vm ** 3)
    assert_chi_square(observed, joint.reshape(-1).numpy(), "joint law of the first 3 tokens")
