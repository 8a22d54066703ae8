"""The fused FlashMap draft step (flashmap_ext.drafters.flashmap.fused) against the reference drafter:
memory K/V, 1- and 2-step logits and tokens, on CPU (every op has a CPU kernel) and — on a GPU — the bf16
CUDA kernels under the error budget, with near-tie token mismatches counted, and CUDA-graph replay."""
import copy

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap import fused as fused
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.target.tables import TargetTables

# Widths the CUDA kernels accept (GEMM inputs multiples of 64, head dim 64): the same config runs on both.
TINY = dict(n_layers=2, width=128, heads=2, block_size=16, cond_dim=64, target_layer_ids=(0, 2))


def make(target, dtype=torch.float32, device="cpu", seed=0):
    torch.manual_seed(seed)
    drafter = FlashMapDrafter.for_target(target, **TINY)
    drafter.reset_parameters(zero_init=False)
    return drafter.to(device=device, dtype=dtype).attach_target(target).eval()


def inputs(drafter, batch, length, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    c = drafter.config
    taps = torch.randn(batch, length, len(c.target_layer_ids) * c.d_target, generator=g).to(device)
    xi = torch.randn(batch, c.block_size, c.d_target, generator=g).to(device)
    anchor = torch.randint(0, c.vocab_size, (batch,), generator=g).to(device)
    return taps, drafter.noise_from_xi(xi), anchor


def two_memories(drafter, packed, taps, chunks):
    ids = torch.zeros(taps.shape[:2], dtype=torch.int64, device=taps.device)
    ref_mem, fused_mem = drafter.new_memory(taps.shape[0]), drafter.new_memory(taps.shape[0])
    start = 0
    for n in chunks:
        drafter.extend_memory(ref_mem, ids[:, start:start + n], taps[:, start:start + n])
        fused.fused_extend_memory(packed, fused_mem, ids[:, start:start + n], taps[:, start:start + n])
        start += n
    return ref_mem, fused_mem


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab_size=300, hidden_size=64)


def test_fused_extend_memory_equals_reference(target):
    drafter = make(target)
    taps, _, _ = inputs(drafter, 3, 70)
    ref_mem, fused_mem = two_memories(drafter, fused.pack_weights(drafter), taps, [1, 69])  # growth past 64
    assert fused_mem.length == ref_mem.length == 70 and fused_mem.capacity >= 70
    assert fused_mem.k[:, :, :, :70].abs().sum() > 0
    torch.testing.assert_close(fused_mem.k[:, :, :, :70], ref_mem.k[:, :, :, :70], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_mem.v[:, :, :, :70], ref_mem.v[:, :, :, :70], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_fused_draft_block_equals_reference_on_cpu(target, steps):
    drafter = make(target)
    packed = fused.pack_weights(drafter)
    taps, z, anchor = inputs(drafter, 3, 9)
    ref_mem, fused_mem = two_memories(drafter, packed, taps, [9])
    r = draft_flashmap(drafter, ref_mem, anchor, steps=steps, noise=z, return_logits=True)
    f = fused.fused_draft_block(packed, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    torch.testing.assert_close(f.logits, r.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(f.tokens, r.tokens)
    assert fused.fused_draft_block(packed, fused_mem, anchor, steps=steps, noise=z).logits is None
    assert fused_mem.length == ref_mem.length == 9  # the anchor entry is scratch, never committed


def test_fused_supported_needs_bf16_on_a_gpu_and_kernel_friendly_widths(target):
    drafter = make(target)
    assert not fused.fused_supported(drafter)  # fp32 on CPU: the fused ops still run, the CUDA kernels don't apply
    if torch.cuda.is_available():
        assert fused.fused_supported(make(tiny_qwen3(vocab_size=300, hidden_size=64).to(torch.bfloat16).cuda(),
                                          torch.bfloat16, "cuda"))


def test_fused_draft_block_draws_the_drafters_seeded_noise(target):
    drafter = make(target)
    packed = fused.pack_weights(drafter)
    taps, _, anchor = inputs(drafter, 2, 5)
    ref_mem, fused_mem = two_memories(drafter, packed, taps, [5])
    seed, position = torch.tensor([3, 4]), torch.tensor([5, 6])
    r = draft_flashmap(drafter, ref_mem, anchor, seed=seed, position=position)
    f = fused.fused_draft_block(packed, fused_mem, anchor, seed=seed, position=position)
    assert torch.equal(f.tokens, r.tokens)
    with pytest.raises(ValueError, match="steps"):
        fused.fused_draft_block(packed, fused_mem, anchor, steps=3, seed=seed, position=position)


# ------------------------------------------------------------------ CUDA (bf16 kernels)
@pytest.mark.cuda
@pytest.mark.parametrize("steps", [1, 2])
def test_fused_draft_block_cuda_within_budget(steps, record_property):
    """Fused bf16 vs an fp64 copy of the same drafter and target; the bf16 reference module is the
    low-precision version of the error-budget rule. Tokens may differ only at near-ties (counted)."""
    lowp = make(tiny_qwen3(vocab_size=20000, hidden_size=64).to(torch.bfloat16).cuda(), torch.bfloat16, "cuda")
    lowp.allow_fused = False  # the bf16 module on the reference (PyTorch) path
    oracle = copy.deepcopy(lowp).double()  # the same bf16-rounded numbers, in fp64
    oracle.attach_tables(TargetTables(lowp.tables.embedding.double(), lowp.tables.head_weight.double(), None))
    packed = fused.pack_weights(lowp)
    taps, z, anchor = inputs(lowp, 3, 97, "cuda")
    mems = {}
    for name, d in (("oracle", oracle), ("lowp", lowp)):
        mems[name] = d.new_memory(3)
        d.extend_memory(mems[name], torch.zeros(3, 97, dtype=torch.int64, device="cuda"), taps)
    fused_mem = lowp.new_memory(3)
    fused.fused_extend_memory(packed, fused_mem, torch.zeros(3, 97, dtype=torch.int64, device="cuda"), taps)
    o = draft_flashmap(oracle, mems["oracle"], anchor, steps=steps, noise=z.double(), return_logits=True)
    lp = draft_flashmap(lowp, mems["lowp"], anchor, steps=steps, noise=z, return_logits=True)
    f = fused.fused_draft_block(packed, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    err = (f.logits.double() - o.logits).abs().max().item()
    base = (lp.logits.double() - o.logits).abs().max().item()
    assert err <= 2 * base, f"fused logits error {err:.3g} > 2 x bf16 module error {base:.3g}"
    mismatched = f.tokens != o.tokens
    gap = o.logits.gather(-1, o.tokens[..., None]) - o.logits.gather(-1, f.tokens[..., None])
    record_property("near_ties", int(mismatched.sum()))
    assert (gap[..., 0][mismatched] <= 2 * base).all(), "a token differs away from a near-tie"


@pytest.mark.cuda
def test_fused_draft_graph_replays_like_eager():
    drafter = make(tiny_qwen3(vocab_size=300, hidden_size=64).to(torch.bfloat16).cuda(), torch.bfloat16, "cuda")
    packed = fused.pack_weights(drafter)
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


def test_packed_weights_follow_load_state_dict_and_to_in_eval_mode(target, monkeypatch):
    """The pack holds concatenated copies (all adaLN modulations): a load_state_dict in eval mode (no
    train()/eval() call) must not leave them stale. Checked on CPU with fused_supported forced on."""
    monkeypatch.setattr(fused, "fused_supported", lambda drafter: True)
    drafter, other = make(target, seed=0), make(target, seed=1)
    stale = drafter.fused_weights()
    assert drafter.fused_weights() is stale  # packed once
    drafter.load_state_dict(other.state_dict())
    fresh = drafter.fused_weights()
    assert fresh is not stale
    expected = torch.cat([b.adaLN.weight for b in other.blocks] + [other.final.adaLN.weight])
    assert torch.equal(fresh.adaln_w, expected) and not torch.equal(stale.adaln_w, expected)
    drafter.to(torch.float64)
    assert drafter.fused_weights() is not fresh and drafter.fused_weights().adaln_w.dtype == torch.float64
