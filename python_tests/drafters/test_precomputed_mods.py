"""Precomputed adaLN modulations of the fused draft step (fused.precompute_mods; FLASHMAP_DIT_PRECOMPUTED_MODS):
the table against a float64 recompute from the drafter's own adaLN modules, and the fused step with the
table against the reference drafter and against the step that recomputes them, on CPU and (bf16) on a GPU."""
import copy

import pytest
import torch
from test_dit_fused import inputs, make, tiny_qwen3, two_memories

from flashmap_ext.drafters.flashmap import fused as fused
from flashmap_ext.drafters.flashmap.draft import draft_flashmap


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab_size=300, hidden_size=64)


def test_table_equals_the_float64_adaln_of_each_block(target):
    drafter = make(target)
    table = fused.pack_weights(drafter, precompute=True).mods
    oracle = copy.deepcopy(drafter).double()
    assert set(table) == {(0.0, 1.0), (0.0, 0.5), (0.5, 1.0)}
    for (tau_s, tau_t), mods in table.items():
        cond = oracle._cond(torch.tensor([tau_s], dtype=torch.float64), torch.tensor([tau_t], dtype=torch.float64))
        want = torch.cat([b.adaLN(cond) for b in oracle.blocks] + [oracle.final.adaLN(cond)], dim=-1)
        assert mods.dtype == torch.float32 and mods.shape == (1, 9 * 2 + 2, 128)
        torch.testing.assert_close(mods.double().view(1, -1), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 2])
def test_fused_step_with_the_table_equals_reference_and_recompute(target, steps):
    drafter = make(target)
    plain, tabled = fused.pack_weights(drafter, precompute=False), fused.pack_weights(drafter, precompute=True)
    assert plain.mods is None
    taps, z, anchor = inputs(drafter, 3, 9)
    ref_mem, fused_mem = two_memories(drafter, tabled, taps, [9])
    r = draft_flashmap(drafter, ref_mem, anchor, steps=steps, noise=z, return_logits=True)
    f = fused.fused_draft_block(tabled, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    g = fused.fused_draft_block(plain, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    torch.testing.assert_close(f.logits, r.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f.logits, g.logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(f.tokens, r.tokens) and torch.equal(f.tokens, g.tokens)


def test_switch_is_off_by_default(target, monkeypatch):
    drafter = make(target)
    monkeypatch.delenv("FLASHMAP_DIT_PRECOMPUTED_MODS", raising=False)
    assert fused.pack_weights(drafter).mods is None
    monkeypatch.setenv("FLASHMAP_DIT_PRECOMPUTED_MODS", "1")
    assert fused.pack_weights(drafter).mods is not None


@pytest.mark.cuda
@pytest.mark.parametrize("steps", [1, 2])
def test_table_on_cuda_matches_recompute_within_bf16(steps):
    drafter = make(tiny_qwen3(vocab_size=300, hidden_size=64).to(torch.bfloat16).cuda(), torch.bfloat16, "cuda")
    plain, tabled = fused.pack_weights(drafter, precompute=False), fused.pack_weights(drafter, precompute=True)
    taps, z, anchor = inputs(drafter, 2, 40, "cuda")
    memory = drafter.new_memory(2)
    fused.fused_extend_memory(plain, memory, torch.zeros(2, 40, dtype=torch.int64, device="cuda"), taps)
    f = fused.fused_draft_block(tabled, memory, anchor, steps=steps, noise=z, return_logits=True)
    g = fused.fused_draft_block(plain, memory, anchor, steps=steps, noise=z, return_logits=True)
    torch.testing.assert_close(f.logits.float(), g.logits.float(), rtol=0.05, atol=0.05)
