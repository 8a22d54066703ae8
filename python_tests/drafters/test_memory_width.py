"""The FlashMap drafter with `memory_width`: memory entries (tap and anchor projections) of their own width,
from which each block's memory keys and values are projected. Parameter shapes against a hand count, the
default against the trunk width, inference path against the training forward, checkpoints, and the paths
that refuse it (the T = 0 identity with plain greedy decoding is in test_speculate)."""
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, fused
from flashmap_ext.integrations.vllm.export import export_flashmap
from support.drafter_doubles import assert_inference_matches_training

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2))


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_drafter(target, memory_width=48):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY, memory_width=memory_width)
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_shapes_and_parameter_count(target):
    wide, plain = make_drafter(target, 48), make_drafter(target, None)
    d, w, m, n_taps = 64, 32, 48, 2  # tiny_qwen3's hidden size
    assert wide.tap_proj.weight.shape == (m, n_taps * d) and wide.anchor_proj.weight.shape == (m, d)
    assert wide.tap_norm.weight.shape == wide.anchor_norm.weight.shape == (m,)
    for block in wide.blocks:
        attn = block.cross_attn
        assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (w, m)
        assert attn.q_proj.weight.shape == (w, w)
    # per extra memory channel: a row of each projection (+ bias) and a norm gain for taps and anchors,
    # and a column of K and V in every block
    per_channel = (n_taps * d + 1 + 1) + (d + 1 + 1) + TINY["n_layers"] * 2 * w
    assert n_params(wide) - n_params(plain) == (m - w) * per_channel


@torch.no_grad()
def test_memory_width_equal_to_width_is_the_default_drafter(target):
    a, b = make_drafter(target, None), make_drafter(target, 32)
    assert a.config.memory_entry_width == b.config.memory_entry_width == 32
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@torch.no_grad()
def test_inference_matches_training_forward(target):
    assert_inference_matches_training(make_drafter(target), torch.tensor([[0.0, 0.3, 0.5], [1.0, 0.0, 0.7]]))


def test_checkpoint_roundtrip_and_older_configs(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path / "src")
    loaded = FlashMapDrafter.from_pretrained(tmp_path / "src", target)
    assert loaded.config.memory_width == 48
    assert torch.equal(loaded.blocks[1].cross_attn.v_proj.weight, drafter.blocks[1].cross_attn.v_proj.weight)
    older = {k: v for k, v in FlashMapConfig(**TINY).to_dict().items() if k != "memory_width"}
    assert FlashMapConfig.from_dict(older).memory_width is None  # configs made before the field


def test_refusals(target, tmp_path):
    for bad in (0, 2.5, "32", True):
        with pytest.raises(ValueError, match=f"invalid memory_width={bad!r} "):
            FlashMapConfig(**TINY, memory_width=bad)
    with pytest.raises(ValueError, match="invalid memory_width=48 .*joint_attention"):
        FlashMapConfig(**TINY, memory_width=48, joint_attention=True)
    assert FlashMapConfig(**TINY, memory_width=32, joint_attention=True).memory_entry_width == 32
    make_drafter(target).save_pretrained(tmp_path / "src")
    with pytest.raises(NotImplementedError, match="memory_width=48 is not served by the vLLM plugin"):
        export_flashmap(tmp_path / "src", tmp_path / "dst")


def test_fused_kernels_take_only_trunk_wide_memory():
    """fused_supported on a stand-in for a bf16 GPU drafter whose every other width the kernels take."""
    def stand_in(memory_width):
        config = FlashMapConfig(n_layers=1, width=128, heads=2, cond_dim=64, d_target=64, target_layer_ids=(0,),
                                memory_width=memory_width)
        return SimpleNamespace(config=config, slot_pos=SimpleNamespace(is_cuda=True), dtype=torch.bfloat16)
    assert fused.fused_supported(stand_in(None)) and fused.fused_supported(stand_in(128))
    assert not fused.fused_supported(stand_in(192))
