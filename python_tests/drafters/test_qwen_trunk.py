"""The FlashMap drafter with the "qwen3" trunk (DFlash's decoder layer in the flow model). One layer against a
float64 hand computation (grouped-query attention over memory and own block, QK-norm, RoPE, SwiGLU), the
parameter count by hand, the inference path against the training forward, checkpoints, identity layers, and
the configs and paths that refuse it (the T = 0 identity with plain greedy decoding is in test_speculate)."""
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, fused
from flashmap_ext.drafters.flashmap.qwen_block import QwenBlock
from flashmap_ext.integrations.vllm.export import export_flashmap
from support.drafter_doubles import assert_inference_matches_training

D = 64  # tiny_qwen3's hidden size
TINY = dict(n_layers=2, width=D, heads=4, kv_heads=2, block_size=4, cond_dim=16, mlp_ratio=1.5,
            target_layer_ids=(0, 2), trunk="qwen3", two_time=False)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_drafter(target, **fields):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **{**TINY, **fields})
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def test_parameter_count(target):
    w, hd, g, h, cond, K = D, D // 4, 2, 96, 16, 4
    block = w * w + 2 * (w * g * hd) + w * w + 2 * hd + 3 * w * h + 2 * w  # q, k, v, o, qk-norms, SwiGLU, norms
    outside = (2 * D * w + w + w) + (D * w + w + w) + (D * w + w + w) + K * w  # taps, anchor, slot in, slot pos
    time = (256 * cond + cond) + (cond * cond + cond) + (cond * w + w)  # sinusoid MLP, time_in
    assert sum(p.numel() for p in make_drafter(target).parameters()) == outside + time + 2 * block + w


def _rms(x, gain, eps=1e-6):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * gain.double()


def _rope(x, pos, theta):
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos.double()[..., None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin


def _heads(y, n, norm=None):
    y = y.unflatten(-1, (n, -1))
    return (y if norm is None else _rms(y, norm.weight)).transpose(1, 2)


@torch.no_grad()
def test_block_against_float64_reference():
    torch.manual_seed(5)
    w, H, G, K, A, S, theta = 32, 4, 2, 3, 2, 5, 10_000.0
    blk = QwenBlock(w, H, G, 40, 1e-6, theta)
    for p in blk.parameters():
        p.normal_(std=0.4)
    B = 2
    x, mem = torch.randn(B, A, K, w), torch.randn(B, S, w)
    mem_pos, q_pos = torch.arange(S).expand(B, S), (7 + torch.arange(A * K)).expand(B, -1)
    mask = torch.rand(B, 1, A * K, S) > 0.4
    mask[..., 0] = True
    got = blk(x, None, blk.memory_kv(mem, mem_pos), q_pos, mask)

    at, md = blk.attn, mem.double()
    k_mem = _rope(_heads(md @ at.k_proj.weight.double().T, G, at.k_norm), mem_pos, theta)
    v_mem = _heads(md @ at.v_proj.weight.double().T, G)
    h = x.double().reshape(B, A * K, w)
    n = _rms(h, blk.input_norm.weight)
    q = _rope(_heads(n @ at.q_proj.weight.double().T, H, at.q_norm), q_pos, theta)
    k = torch.cat([k_mem, _rope(_heads(n @ at.k_proj.weight.double().T, G, at.k_norm), q_pos, theta)], 2)
    v = torch.cat([v_mem, _heads(n @ at.v_proj.weight.double().T, G)], 2)
    k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)  # query head i reads kv head i // 2
    block_of = torch.arange(A * K) // K
    visible = torch.cat([mask, (block_of[:, None] == block_of[None]).expand(B, 1, A * K, A * K)], -1)
    scores = (q @ k.transpose(-1, -2) / (w // H) ** 0.5).masked_fill(~visible, float("-inf"))
    h = h + (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2) @ at.o_proj.weight.double().T
    n2 = _rms(h, blk.post_norm.weight)
    mlp = blk.mlp
    gate, up = n2 @ mlp.gate_proj.weight.double().T, n2 @ mlp.up_proj.weight.double().T
    want = h + (gate * torch.sigmoid(gate) * up) @ mlp.down_proj.weight.double().T
    torch.testing.assert_close(got.double(), want.view(B, A, K, w), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_inference_matches_training_forward(target):
    assert_inference_matches_training(make_drafter(target), torch.tensor([[0.0, 0.3, 0.5], [1.0, 0.0, 0.7]]))


@torch.no_grad()
def test_time_conditioning_starts_at_zero_and_then_matters(target):
    """zero_init leaves the layers random (as DFlash) but the τ conditioning at 0; trained, τ changes the draft."""
    fresh = FlashMapDrafter.for_target(target, **TINY).eval()
    assert fresh.time_in.weight.abs().max() == 0
    drafter, z = make_drafter(target), torch.randn(1, 4, D)
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, torch.tensor([[3, 4, 5]]), torch.randn(1, 3, 2 * D))
    a, b = (drafter.denoise(memory, torch.tensor([7]), z, tau, tau) for tau in (0.0, 0.5))
    assert not torch.allclose(a, b)


def test_identity_layer_passes_its_input_on(target):
    drafter = make_drafter(target)
    blk = drafter.blocks[0]
    FlashMapDrafter.identity_layer_init(blk)
    x, kv = torch.randn(1, 2, 4, D), blk.memory_kv(torch.randn(1, 3, D), torch.arange(3)[None])
    torch.testing.assert_close(blk(x, None, kv, torch.arange(8)[None], None), x, rtol=0, atol=0)


def test_checkpoint_roundtrip_and_older_configs(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path / "src")
    loaded = FlashMapDrafter.from_pretrained(tmp_path / "src", target)
    assert (loaded.config.trunk, loaded.config.kv_heads) == ("qwen3", 2)
    assert torch.equal(loaded.blocks[1].attn.k_proj.weight, drafter.blocks[1].attn.k_proj.weight)
    assert loaded.new_memory(1).k.shape[2] == 2  # the memory holds the grouped key/value heads
    older = {k: v for k, v in FlashMapConfig(n_layers=1, width=32, heads=4).to_dict().items()
             if k not in ("trunk", "kv_heads")}
    assert FlashMapConfig.from_dict(older).trunk == "dit"  # configs made before the field
    with pytest.raises(ValueError, match="field trunk: expected a string, got 3"):
        FlashMapConfig.from_dict({**older, "trunk": 3})


@pytest.mark.parametrize("fields, name", [
    (dict(trunk="qwen"), "trunk"), (dict(width=32), "width"), (dict(kv_heads=3), "kv_heads"),
    (dict(memory_width=32), "memory_width"), (dict(head_mlp=16), "head_mlp"),
    (dict(joint_attention=True), "joint_attention"), (dict(trunk="dit", kv_heads=2), "kv_heads"),
])
def test_config_refusals(fields, name):
    with pytest.raises(ValueError, match=f"invalid {name}="):
        FlashMapConfig(**{**TINY, "d_target": D, **fields})


def test_export_and_fused_kernels_refuse_it(target, tmp_path):
    make_drafter(target).save_pretrained(tmp_path / "src")
    with pytest.raises(NotImplementedError, match="trunk='qwen3' is not served by the vLLM plugin"):
        export_flashmap(tmp_path / "src", tmp_path / "dst")

    def stand_in(trunk):  # a bf16 GPU drafter whose every width the kernels take
        config = FlashMapConfig(n_layers=1, width=128, heads=2, cond_dim=64, d_target=128, target_layer_ids=(0,),
                                trunk=trunk)
        return SimpleNamespace(config=config, slot_pos=SimpleNamespace(is_cuda=True), dtype=torch.bfloat16)
    assert fused.fused_supported(stand_in("dit"))
    assert not fused.fused_supported(stand_in("qwen3"))
