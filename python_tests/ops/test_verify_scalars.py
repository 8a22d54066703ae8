"""`verify` / `sample` Python scalars outside their domain: ValueError naming the
argument, as the loop's Request and the CLI do (temperature finite and >= 0, top_p in (0, 1], top_k >= 0)."""
import math

import pytest
import torch

from flashmap_ext import ops

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


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=1e-6), dict(top_p=1e-9),
                                dict(top_p=1.0), dict(top_k=0), dict(top_k=2**40)])
def test_verify_accepts_the_domain_edges(kw):
    ops.verify(torch.randn(2, 4, 10), torch.zeros(2, 3, dtype=torch.int64), **kw)
