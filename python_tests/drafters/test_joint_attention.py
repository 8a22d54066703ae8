"""The FlashMap drafter with `joint_attention` (DESIGN.md §5.2): one attention over the memory and the
block's own slots. The layer against a float64 loop over each query's visible keys; the drafter's
inference path against its training forward; blocks that must not see each other; checkpoints; the
paths that refuse it."""
import math

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter
from flashmap_ext.drafters.flashmap.block import DiTBlock, JointAttention
from flashmap_ext.integrations.vllm.export import export_flashmap
from support.drafter_doubles import assert_inference_matches_training

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2), joint_attention=True)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_drafter(target, **overrides):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **{**TINY, **overrides})
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def _rms(x, weight, eps):
    return x / math.sqrt(sum(v * v for v in x) / len(x) + eps) * weight


def _rope(x, pos, theta):
    """Rotate-half RoPE of one head vector at one position, frequencies θ^(−2i/hd) (the drafter's)."""
    half = len(x) // 2
    out = x.clone()
    for i in range(half):
        a = pos * theta ** (-2 * i / len(x))
        out[i] = x[i] * math.cos(a) - x[i + half] * math.sin(a)
        out[i + half] = x[i + half] * math.cos(a) + x[i] * math.sin(a)
    return out


def loop_reference(attn: JointAttention, x, q_pos, mem, mem_pos, mask, K):
    """float64 loop: per row, head and query, softmax over the memory entries `mask` allows and the slots of
    the query's own block, keys of both made by the same projections."""
    B, Q, w = x.shape
    h, hd, eps, theta = attn.heads, w // attn.heads, attn.q_norm.variance_epsilon, attn.rotary.theta
    out = torch.zeros(B, Q, w, dtype=torch.float64)
    for b in range(B):
        q_all, k_slot, v_slot = attn.q_proj(x[b]), attn.k_proj(x[b]), attn.v_proj(x[b])
        k_mem, v_mem = attn.k_proj(mem[b]), attn.v_proj(mem[b])
        for i in range(Q):
            heads = []
            for hh in range(h):
                sl = slice(hh * hd, (hh + 1) * hd)
                q = _rope(_rms(q_all[i, sl], attn.q_norm.weight, eps), int(q_pos[b, i]), theta)
                keys, vals = [], []
                for j in range(mem.shape[1]):
                    if mask[b, 0, i, j]:
                        keys.append(_rope(_rms(k_mem[j, sl], attn.k_norm.weight, eps), int(mem_pos[b, j]), theta))
                        vals.append(v_mem[j, sl])
                for j in range(Q):
                    if j // K == i // K:
                        keys.append(_rope(_rms(k_slot[j, sl], attn.k_norm.weight, eps), int(q_pos[b, j]), theta))
                        vals.append(v_slot[j, sl])
                scores = torch.stack([q @ k for k in keys]) / math.sqrt(hd)
                heads.append(torch.softmax(scores, 0) @ torch.stack(vals))
            out[b, i] = torch.cat(heads)
        out[b] = attn.out(out[b].clone())
    return out


@torch.no_grad()
def test_joint_attention_matches_a_float64_loop():
    torch.manual_seed(3)
    attn = JointAttention(16, 2, 1e-6, 10_000.0).double()
    for norm in (attn.q_norm, attn.k_norm):
        norm.weight.uniform_(0.5, 1.5)
    B, A, K, S = 2, 3, 2, 5
    x, mem = torch.randn(B, A * K, 16, dtype=torch.float64), torch.randn(B, S, 16, dtype=torch.float64)
    mem_pos = torch.arange(S).expand(B, S)
    q_pos = torch.randint(0, 40, (B, A * K))
    mask = torch.rand(B, 1, A * K, S) < 0.6
    mask[..., 0] = True  # every query reads something of the memory; its own block it always reads
    got = attn(x, q_pos, *attn.memory_kv(mem, mem_pos), mask, K)
    # the norms and RoPE angles run in fp32 inside the float64 module (as the fused kernels): fp32 tolerance
    torch.testing.assert_close(got, loop_reference(attn, x, q_pos, mem, mem_pos, mask, K), rtol=1e-5, atol=1e-5)
    got_all = attn(x, q_pos, *attn.memory_kv(mem, mem_pos), None, K)  # None: every memory entry
    want_all = loop_reference(attn, x, q_pos, mem, mem_pos, torch.ones_like(mask), K)
    torch.testing.assert_close(got_all, want_all, rtol=1e-5, atol=1e-5)


def test_joint_block_has_one_attention_and_six_modulations():
    split, joint = DiTBlock(32, 4, 4.0, 16, 1e-6, 1e4), DiTBlock(32, 4, 4.0, 16, 1e-6, 1e4, joint=True)
    assert joint.self_attn is None and joint.adaLN.out_features == 6 * 32 and split.adaLN.out_features == 9 * 32
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(split) - count(joint) == count(split.self_attn) + 3 * 32 * 17  # self-attn + 3 modulations


@torch.no_grad()
def test_inference_matches_training_forward(target):
    assert_inference_matches_training(make_drafter(target), torch.tensor([[0.0, 0.3, 0.5]] * 2))


@torch.no_grad()
def test_blocks_of_one_batch_do_not_see_each_other(target):
    """Training puts A blocks in one attention: a block's output must not change with another block's slots."""
    drafter = make_drafter(target)
    taps, ids = torch.randn(1, 12, 128), torch.randint(0, 111, (1, 12))
    anchor_pos, tau = torch.tensor([[3, 6, 9]]), torch.zeros(1, 3)
    z = torch.randn(1, 3, 4, 64)
    base = drafter.forward_train(taps, ids, anchor_pos, z, tau, tau)
    z2 = z.clone()
    z2[:, 1] = torch.randn(4, 64)
    moved = drafter.forward_train(taps, ids, anchor_pos, z2, tau, tau)
    assert torch.equal(base[:, [0, 2]], moved[:, [0, 2]])
    assert not torch.allclose(base[:, 1], moved[:, 1])  # its own slots do reach it


def test_checkpoint_roundtrip_and_older_configs(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path)
    loaded = FlashMapDrafter.from_pretrained(tmp_path, target)
    assert loaded.config.joint_attention is True and loaded.blocks[0].self_attn is None
    older = {k: v for k, v in FlashMapConfig(**{**TINY, "joint_attention": False}).to_dict().items()
             if k != "joint_attention"}
    assert FlashMapConfig.from_dict(older).joint_attention is False  # configs made before the field


def test_vllm_export_refuses_joint_attention(target, tmp_path):
    make_drafter(target).save_pretrained(tmp_path / "src")
    with pytest.raises(NotImplementedError, match="joint_attention"):
        export_flashmap(tmp_path / "src", tmp_path / "dst")
