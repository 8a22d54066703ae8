"""Comparing a floating-point result with an independent float64 reference (DESIGN.md §12).

Floats of two different objects, processes, thread counts, CPU kernel paths or dtypes are never compared
with each other bit for bit: each is compared with the float64 reference within a tolerance derived from
the dtype the computation ran in; tokens (integers) are compared exactly.
"""
import torch

#: rounding budget in units of the dtype's epsilon: the tiny test models chain ~10 matmuls whose
#: reductions are at most a few hundred terms long (fp32: 1.2e-4, the bound the oracle tests used)
ULPS = 1024


def reference_tolerance(dtype: torch.dtype, ulps: int = ULPS) -> dict:
    """`atol`/`rtol` for torch.testing.assert_close of a `dtype` result against its float64 reference."""
    eps = torch.finfo(dtype).eps
    return dict(atol=ulps * eps, rtol=ulps * eps)


def assert_close_to_reference(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype | None = None,
                              msg: str = "") -> None:
    """`got` (computed in `dtype`, default its own) within reference_tolerance of the float64 `want`."""
    kw = reference_tolerance(dtype or got.dtype)
    torch.testing.assert_close(got.double(), want.double(), **kw, msg=msg or None)
