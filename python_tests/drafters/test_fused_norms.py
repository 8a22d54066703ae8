"""The fused draft step with the norms inside the linears (pack_weights(fused_norms=True);
FLASHMAP_DIT_FUSED_NORMS=1): against the same step with the unfused ops (drafts identical, logits close at fp32;
bit for bit in bf16, where both keep the same rounding points), against the reference drafter, the memory it
writes, and on a GPU the same checks on the CUDA kernels plus CUDA-graph replay."""
import pytest
import torch
from test_dit_fused import inputs, make, tiny_qwen3, two_memories

from flashmap_ext.drafters.flashmap import fused as fused
from flashmap_ext.drafters.flashmap.draft import draft_flashmap


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab_size=300, hidden_size=64)


def steps_of(drafter, device="cpu", batch=3, length=9, steps=1, precompute=False):
    """(unfused, fused-norms) draft blocks on two memories built by each packing, and the two memories."""
    plain = fused.pack_weights(drafter, precompute=precompute, fused_norms=False)
    normed = fused.pack_weights(drafter, precompute=precompute, fused_norms=True)
    assert not plain.fused_norms and normed.fused_norms and normed.mem_kn.shape == (2, drafter.config.head_dim)
    taps, z, anchor = inputs(drafter, batch, length, device)
    ids = torch.zeros(batch, length, dtype=torch.int64, device=device)
    out, mems = [], []
    for packed in (plain, normed):
        memory = drafter.new_memory(batch)
        fused.fused_extend_memory(packed, memory, ids[:, :length // 2], taps[:, :length // 2])
        fused.fused_extend_memory(packed, memory, ids[:, length // 2:], taps[:, length // 2:])
        out.append(fused.fused_draft_block(packed, memory, anchor, steps=steps, noise=z, return_logits=True))
        mems.append(memory)
    return out, mems


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("precompute", [False, True])
def test_fused_norms_step_equals_the_unfused_step_at_fp32(target, steps, precompute):
    (plain, normed), (m_plain, m_normed) = steps_of(make(target), steps=steps, precompute=precompute)
    assert torch.equal(normed.tokens, plain.tokens)
    torch.testing.assert_close(normed.logits, plain.logits, rtol=1e-5, atol=1e-5)
    n = m_plain.length
    torch.testing.assert_close(m_normed.k[:, :, :, :n], m_plain.k[:, :, :, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m_normed.v[:, :, :, :n], m_plain.v[:, :, :, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_fused_norms_step_equals_the_reference_drafter(target, steps):
    drafter = make(target)
    packed = fused.pack_weights(drafter, fused_norms=True)
    taps, z, anchor = inputs(drafter, 3, 9)
    ref_mem, fused_mem = two_memories(drafter, packed, taps, [4, 5])
    torch.testing.assert_close(fused_mem.k[:, :, :, :9], ref_mem.k[:, :, :, :9], rtol=1e-5, atol=1e-5)
    r = draft_flashmap(drafter, ref_mem, anchor, steps=steps, noise=z, return_logits=True)
    f = fused.fused_draft_block(packed, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    torch.testing.assert_close(f.logits, r.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(f.tokens, r.tokens)


def test_fused_norms_step_is_bitwise_the_unfused_step_in_bf16_on_cpu(target):
    (plain, normed), (m_plain, m_normed) = steps_of(make(target, torch.bfloat16), steps=2)
    assert torch.equal(normed.tokens, plain.tokens) and torch.equal(normed.logits, plain.logits)
    assert torch.equal(m_normed.k, m_plain.k) and torch.equal(m_normed.v, m_plain.v)


def test_switch_is_off_by_default(target, monkeypatch):
    drafter = make(target)
    monkeypatch.delenv("FLASHMAP_DIT_FUSED_NORMS", raising=False)
    assert not fused.pack_weights(drafter).fused_norms and fused.pack_weights(drafter).mem_kn is None
    monkeypatch.setenv("FLASHMAP_DIT_FUSED_NORMS", "0")
    assert not fused.pack_weights(drafter).fused_norms
    monkeypatch.setenv("FLASHMAP_DIT_FUSED_NORMS", "1")
    assert fused.pack_weights(drafter).fused_norms


# ------------------------------------------------------------------ CUDA (bf16 kernels)
def cuda_drafter(vocab_size=300):
    return make(tiny_qwen3(vocab_size=vocab_size, hidden_size=64).to(torch.bfloat16).cuda(), torch.bfloat16, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("steps", [1, 2])
def test_fused_norms_step_on_cuda_is_bitwise_the_unfused_step(steps):
    """The CUDA prologue/epilogues share the unfused kernels' reductions and rounding points (norm_rows.cuh)."""
    (plain, normed), (m_plain, m_normed) = steps_of(cuda_drafter(20000), "cuda", batch=3, length=97, steps=steps)
    assert torch.equal(m_normed.k, m_plain.k) and torch.equal(m_normed.v, m_plain.v)
    assert torch.equal(normed.tokens, plain.tokens) and torch.equal(normed.logits, plain.logits)


@pytest.mark.cuda
def test_fused_norms_graph_replays_like_eager():
    drafter = cuda_drafter()
    packed = fused.pack_weights(drafter, fused_norms=True)
    taps, z, anchor = inputs(drafter, 2, 40, "cuda")
    memory = drafter.new_memory(2)
    memory.reserve(256)
    fused.fused_extend_memory(packed, memory, torch.zeros(2, 40, dtype=torch.int64, device="cuda"), taps)
    for steps in (1, 2):
        graph = fused.FusedDraftGraph(packed, memory, batch_size=2, steps=steps)
        for extra in (0, 7):
            if extra:
                fused.fused_extend_memory(packed, memory, torch.zeros(2, extra, dtype=torch.int64, device="cuda"),
                                          taps[:, :extra])
            eager = fused.fused_draft_block(packed, memory, anchor, steps=steps, noise=z).tokens
            assert torch.equal(graph(memory, anchor, z), eager)
