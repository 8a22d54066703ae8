"""`verify` / `sample` Python scalars outside their domain: ValueError naming the
argument, as the loop's Request and the CLI do (temperature finite and >= 0, top_p in (0, 1], top_k >= 0)."""
import math

import pytest
import torch

from flashmap_ext import ops
from flashmap_ext.ops.verify_reference import verify_reference_detailed
from support.verify_helpers import FRAGILE, random_case

BAD = [("temperature", -1.0), ("temperature", -1e-6), ("temperature", math.inf), ("temperature", math.nan),
       ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.5), ("top_p", math.inf), ("top_p", math.nan),
       ("top_k", -1)]


@pytest.mark.parametrize("name, value", BAD)
def test_verify_rejects_out_of_domain_scalars(name, value):
    logits, drafts = torch.randn(2, 4, 10), torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=f"verify: {name}"):
        ops.verify(logits, drafts, **{name: value})
    with pytest.raises(ValueError, match=f"{name}"):
        ops.sample(logits[:, 0], **{name: value})


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1e-6), dict(temperature=1.0, top_p=1e-9),
                                dict(temperature=1.0, top_p=1.0), dict(temperature=1.0, top_k=0),
                                dict(temperature=1.0, top_k=2**40)])
def test_verify_accepts_the_domain_edges(kw):
    """Each domain's edge runs and decides as the float64 reference does, given the same Python scalars."""
    B, seed, position = 6, 7, 3
    logits, drafts = random_case(B, 3, 10, gen_seed=5)
    out = ops.verify(logits, drafts, seed=seed, position=position, **kw)
    args = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, **kw}
    rows = lambda v, dtype: torch.full((B,), v, dtype=dtype)
    tokens, num_accepted, status, margin = verify_reference_detailed(
        logits, drafts, rows(args["temperature"], torch.float64), rows(args["top_k"], torch.int64),
        rows(args["top_p"], torch.float64), rows(seed, torch.int64), rows(position, torch.int64))
    solid = margin >= FRAGILE
    assert solid.sum() >= B // 2, "too few rows decided away from a threshold to compare"
    assert torch.equal(out.tokens[solid], tokens[solid]) and torch.equal(out.num_accepted[solid], num_accepted[solid])
    assert torch.equal(out.status, status) and not status.any()


@pytest.mark.parametrize("temperature", [1.0, 1e-6, torch.tensor([0.0, 0.8])])
def test_a_sampling_call_without_position_is_refused(temperature):
    """Without `position` every sampling call drew the coins of position 0: the same token for the same seed
    in every round of a loop. A sampling call (any row with temperature > 0) must give it."""
    logits, drafts = torch.randn(2, 4, 10), torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^verify: position is required when sampling"):
        ops.verify(logits, drafts, temperature=temperature)
    with pytest.raises(ValueError, match=r"^sample: position is required when sampling") as err:
        ops.sample(logits[:, 0], temperature=temperature)
    assert str(err.value).endswith("pass the absolute position of the token whose logits row is sampled (S − 1 "
                                   "for the first new token after a prompt of S tokens)")
    with pytest.raises(ValueError) as err:
        ops.verify(logits, drafts, temperature=temperature)
    assert str(err.value).endswith("pass the absolute position of slot 0 (the anchor's)")
    assert ops.sample(logits[:, 0], temperature=temperature, position=5).shape == (2,)


@pytest.mark.parametrize("temperature", [0.0, 0, torch.zeros(2)])
def test_a_greedy_call_needs_no_position(temperature):
    logits, drafts = torch.randn(2, 4, 10), torch.zeros(2, 3, dtype=torch.int64)
    out = ops.verify(logits, drafts, temperature=temperature)
    assert out.tokens[:, 0].tolist() == logits[:, 0].argmax(-1).tolist()  # slot 0: the draft iff it is the argmax
    assert ops.sample(logits[:, 0], temperature=temperature).tolist() == logits[:, 0].argmax(-1).tolist()
