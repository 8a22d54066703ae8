"""verify: torch.library.opcheck (schema, fake kernel, autograd registration, AOT dispatch) on every
sample input, on CPU always and CUDA when present."""
import pytest
import torch

from support.verify_helpers import DEVICES, per_row, random_case


def sample_inputs(device):
    """Positional argument tuples of flashmap::verify covering its modes."""
    B, K, V = 3, 4, 111
    logits, drafts = random_case(B, K, V)
    q = torch.softmax(torch.randn(B, K, V), -1)
    u = torch.rand(B, K + 1, dtype=torch.float64)
    greedy, sampling = per_row(B, 0.0), per_row(B, torch.tensor([0.0, 1.0, 0.5]), 5, 0.9)
    cases = [
        (logits, drafts, greedy, None, 0, None),
        (logits.bfloat16(), drafts, sampling, None, V, u),
        (logits.half(), drafts, sampling, q, 100, None),
        (logits[:, :1], drafts[:, :0], sampling, None, 0, None),          # K = 0: the plain sampler
        (logits[:, :, :50], drafts.clamp(max=49), sampling, q[..., :50], 0, u),  # non-contiguous
    ]
    for lg, dr, p, dp, vv, uu in cases:
        mv = lambda t: None if t is None else t.to(device)
        yield (mv(lg), mv(dr), *(mv(p[k]) for k in ("temperature", "top_k", "top_p", "seed", "position")),
               mv(dp), vv, mv(uu))


@pytest.mark.parametrize("device", DEVICES)
def test_verify_opcheck(device):
    for args in sample_inputs(device):
        torch.library.opcheck(torch.ops.flashmap.verify.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_verify_scalars_opcheck(device):
    """The by-value overload: every parameter as a value, and a mix of [B] tensors and values."""
    for args in sample_inputs(device):
        logits, drafts, temperature, top_k, top_p, seed, position, dp, vv, uu = args
        values = (0.7, 5, 0.9, 3, 100)
        torch.library.opcheck(torch.ops.flashmap.verify.scalars,
                              (logits, drafts, None, None, None, None, None, *values, dp, vv, uu))
        torch.library.opcheck(torch.ops.flashmap.verify.scalars,
                              (logits, drafts, temperature, None, top_p, seed, None, *values, dp, vv, uu))
