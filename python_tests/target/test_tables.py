"""TargetTables: logits of strided hidden states (a block's first slots) against a float64 product."""
import pytest
import torch

from flashmap_ext.target.tables import TargetTables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, torch.tensor([5, 0, 17, 3])])
def test_logits_of_a_strided_slice_match_float64(dtype, rows):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(20, 16, generator=g).to(dtype)
    head = torch.randn(20, 16, generator=g).to(dtype)
    bias = torch.randn(20, generator=g).to(dtype)
    tables = TargetTables(emb, head, bias, rows)
    hidden = torch.randn(3, 7, 16, generator=g).to(dtype)[:, :4]  # [B, K, d][:, :k]: not contiguous
    assert not hidden.is_contiguous()
    keep = torch.arange(20) if rows is None else rows
    ref = hidden.double() @ head.double()[keep].T + bias.double()[keep]
    tol = 1e-4 if dtype == torch.float32 else 0.15
    torch.testing.assert_close(tables.logits(hidden).double(), ref, rtol=0, atol=tol)
    full_ref = hidden.double() @ head.double().T + bias.double()
    torch.testing.assert_close(tables.full_logits(hidden).double(), full_ref, rtol=0, atol=tol)


def test_the_head_product_reads_a_dense_input(monkeypatch):
    """A strided input sends torch's CPU linear to a path 5–80× slower (tables.py::_dense); the product
    must see a contiguous tensor."""
    seen = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, *a: seen.append(x.is_contiguous()) or linear(x, *a))
    tables = TargetTables(torch.randn(20, 16), torch.randn(20, 16), None, torch.tensor([1, 2]))
    hidden = torch.randn(2, 7, 16)[:, :3]
    tables.logits(hidden)
    tables.full_logits(hidden)
    assert seen == [True, True]
