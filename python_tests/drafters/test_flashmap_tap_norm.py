"""Per-tap RMSNorm before the tap projection (FlashMapConfig.tap_input_norm): a float64 loop
reference, the eager drafter's memory, the fused path on CPU, and the checkpoint round trip."""
import json

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapDrafter, fused
from flashmap_ext.drafters.flashmap.model import per_tap_rms_norm

TINY = dict(n_layers=2, width=128, heads=2, block_size=4, cond_dim=64, target_layer_ids=(0, 1, 2))
EPS = 1e-6


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab_size=300, hidden_size=64)


def make(target, tap_input_norm=True, seed=0):
    torch.manual_seed(seed)
    drafter = FlashMapDrafter.for_target(target, **TINY, tap_input_norm=tap_input_norm)
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def reference_norm(taps, n_taps, eps=EPS):
    """float64 loop: each tap's vector divided by sqrt(mean of its squares + eps)."""
    out = torch.empty(taps.shape, dtype=torch.float64)
    d = taps.shape[-1] // n_taps
    flat, res = taps.double().reshape(-1, taps.shape[-1]), out.view(-1, taps.shape[-1])
    for row in range(flat.shape[0]):
        for i in range(n_taps):
            x = flat[row, i * d:(i + 1) * d]
            res[row, i * d:(i + 1) * d] = x / (sum(float(v) ** 2 for v in x) / d + eps) ** 0.5
    return out


def scaled_taps(drafter, B=2, T=5, seed=1):
    """Random taps whose layers differ in scale by 100x (as the target's early and late taps do)."""
    c, g = drafter.config, torch.Generator().manual_seed(seed)
    n = len(c.target_layer_ids)
    scale = torch.tensor([1.0, 10.0, 100.0])[:n].repeat_interleave(c.d_target)
    return torch.randn(B, T, n * c.d_target, generator=g) * scale


def memory_of(drafter, taps):
    mem = drafter.new_memory(taps.shape[0])
    drafter.extend_memory(mem, torch.zeros(taps.shape[:2], dtype=torch.int64), taps)
    return mem


def test_per_tap_rms_norm_matches_a_float64_loop(target):
    taps = scaled_taps(make(target))
    got = per_tap_rms_norm(taps, 3, EPS)
    assert got.dtype == torch.float32 and got.shape == taps.shape
    torch.testing.assert_close(got.double(), reference_norm(taps, 3), rtol=1e-5, atol=1e-6)
    got16 = per_tap_rms_norm(taps.bfloat16(), 3, EPS)  # fp32 math on bf16 input
    torch.testing.assert_close(got16.double(), reference_norm(taps.bfloat16().float(), 3), rtol=1e-5, atol=1e-6)


def test_memory_is_that_of_the_normalised_taps_and_ignores_each_taps_scale(target):
    on, off = make(target, True), make(target, False)  # same seed: the same weights
    taps = scaled_taps(on)
    mem = memory_of(on, taps)
    ref = memory_of(off, reference_norm(taps, 3).float())  # no norm inside, normalised by the reference
    torch.testing.assert_close(mem.k[:, :, :, :5], ref.k[:, :, :, :5], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mem.v[:, :, :, :5], ref.v[:, :, :, :5], rtol=1e-4, atol=1e-5)
    # mean(x²) stays >> eps, so only the RMS moves
    rescale = torch.tensor([0.2, 7.0, 0.5]).repeat_interleave(on.config.d_target)
    again = memory_of(on, taps * rescale)
    torch.testing.assert_close(again.v[:, :, :, :5], mem.v[:, :, :, :5], rtol=1e-4, atol=1e-4)
    changed = memory_of(off, taps * rescale)  # without the norm, the scale of a tap matters
    assert not torch.allclose(changed.v[:, :, :, :5], memory_of(off, taps).v[:, :, :, :5], rtol=1e-3, atol=1e-3)


def test_fused_extend_memory_applies_the_norm_like_the_eager_drafter(target):
    drafter = make(target)
    packed = fused.pack_weights(drafter)
    assert packed.tap_in_norm is not None and fused.pack_weights(make(target, False)).tap_in_norm is None
    taps = scaled_taps(drafter, T=7)
    ref = memory_of(drafter, taps)
    mem = drafter.new_memory(2)
    fused.fused_extend_memory(packed, mem, torch.zeros(2, 7, dtype=torch.int64), taps)
    torch.testing.assert_close(mem.k[:, :, :, :7], ref.k[:, :, :, :7], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mem.v[:, :, :, :7], ref.v[:, :, :, :7], rtol=1e-4, atol=1e-5)


def test_checkpoint_records_the_option_and_old_configs_load_without_it(target, tmp_path):
    drafter = make(target)
    drafter.save_pretrained(tmp_path / "on")
    assert json.loads((tmp_path / "on" / "config.json").read_text())["tap_input_norm"] is True
    loaded = FlashMapDrafter.from_pretrained(tmp_path / "on", target).eval()
    assert loaded.config.tap_input_norm is True
    taps = scaled_taps(drafter)
    torch.testing.assert_close(memory_of(loaded, taps).v, memory_of(drafter, taps).v)
    make(target, False).save_pretrained(tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    del cfg["tap_input_norm"]  # a checkpoint written before the option existed
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    assert FlashMapDrafter.from_pretrained(tmp_path / "old", target).config.tap_input_norm is False
