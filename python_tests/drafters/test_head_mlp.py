"""The FlashMap drafter with `head_mlp`: a residual MLP at the target's width between the final Linear and the
LM head. The final layer against a float64 hand computation, parameter count by hand, adaLN-Zero start as the
drafter without it, inference path against the training forward, checkpoints, and the paths that refuse it
(the T = 0 identity with plain greedy decoding is in test_speculate)."""
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, fused
from flashmap_ext.drafters.flashmap.block import FinalLayer
from flashmap_ext.integrations.vllm.export import export_flashmap
from support.drafter_doubles import assert_inference_matches_training

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2))
D = 64  # tiny_qwen3's hidden size


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_drafter(target, head_mlp=48, zero_init=False):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY, head_mlp=head_mlp)
    drafter.reset_parameters(zero_init=zero_init)
    return drafter.eval()


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_parameter_count(target):
    h = 48
    # up (D x h + h), down (h x D + D), the norm's gain (D)
    assert n_params(make_drafter(target, h)) - n_params(make_drafter(target, None)) == D * h + h + h * D + D + D


@torch.no_grad()
def test_final_layer_against_float64_reference():
    torch.manual_seed(3)
    w, cond, h, eps = 8, 6, 5, 1e-6
    layer = FinalLayer(w, cond, D, eps, head_mlp=h)
    for p in layer.parameters():
        p.normal_(std=0.5)
    x, c = torch.randn(2, 3, 4, w), torch.randn(2, 3, cond)
    got = layer(x, c)

    def lin(mod, v):
        return v @ mod.weight.double().T + mod.bias.double()

    xd, cd = x.double(), c.double()
    shift, scale = lin(layer.adaLN, cd).chunk(2, dim=-1)
    z = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + eps)
    y = lin(layer.out, z * (1 + scale[:, :, None]) + shift[:, :, None])
    n = y / torch.sqrt(y.square().mean(-1, keepdim=True) + eps) * layer.head_norm.weight.double()
    u = lin(layer.head_mlp[0], n)
    gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
    want = y + lin(layer.head_mlp[2], gelu)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_adaln_zero_start_is_the_drafter_without_it(target):
    """At zero_init the head MLP's output Linear is zero: the drafter computes what the same weights without
    the MLP compute (so `--init-from` a plain checkpoint starts from its function)."""
    plain, wide = make_drafter(target, None, zero_init=True), make_drafter(target, 48, zero_init=True)
    for p in plain.parameters():  # non-zero everywhere, so the comparison is not 0 = 0
        p.normal_(std=0.3)
    missing, unexpected = wide.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("final.head_") for k in missing)
    assert wide.final.head_mlp[2].weight.abs().max() == 0
    x, c = torch.randn(2, 3, 4, 32), torch.randn(2, 3, 16)
    torch.testing.assert_close(wide.final(x, c), plain.final(x, c), rtol=0, atol=0)


@torch.no_grad()
def test_inference_matches_training_forward(target):
    assert_inference_matches_training(make_drafter(target), torch.tensor([[0.0, 0.3, 0.5], [1.0, 0.0, 0.7]]))


def test_checkpoint_roundtrip_and_older_configs(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path / "src")
    loaded = FlashMapDrafter.from_pretrained(tmp_path / "src", target)
    assert loaded.config.head_mlp == 48
    assert torch.equal(loaded.final.head_mlp[0].weight, drafter.final.head_mlp[0].weight.to(loaded.dtype))
    older = {k: v for k, v in FlashMapConfig(**TINY).to_dict().items() if k != "head_mlp"}
    assert FlashMapConfig.from_dict(older).head_mlp is None  # configs made before the field


def test_refusals(target, tmp_path):
    for bad in (0, 2.5, "32", True):
        with pytest.raises(ValueError, match=f"invalid head_mlp={bad!r} "):
            FlashMapConfig(**TINY, head_mlp=bad)
    make_drafter(target).save_pretrained(tmp_path / "src")
    with pytest.raises(NotImplementedError, match="head_mlp=48 is not served by the vLLM plugin"):
        export_flashmap(tmp_path / "src", tmp_path / "dst")


def test_fused_kernels_refuse_it():
    """fused_supported on a stand-in for a bf16 GPU drafter whose every width the kernels take."""
    def stand_in(head_mlp):
        config = FlashMapConfig(n_layers=1, width=128, heads=2, cond_dim=64, d_target=64, target_layer_ids=(0,),
                                head_mlp=head_mlp)
        return SimpleNamespace(config=config, slot_pos=SimpleNamespace(is_cuda=True), dtype=torch.bfloat16)
    assert fused.fused_supported(stand_in(None))
    assert not fused.fused_supported(stand_in(64))
