"""The FlashMap drafter with `tau_gated_input`: the state's part of each slot token scaled by τ_s. At τ = 0
the one-step draft cannot depend on the noise; at τ_s it equals the ungated drafter whose slot-norm gain is
multiplied by τ_s (the same product, written in the weights); inference path against the training forward;
checkpoints; the paths that refuse it."""
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


def make_drafter(target, gated=True):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY, tau_gated_input=gated)
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def memory_of(drafter, ids, taps):
    memory = drafter.new_memory(ids.shape[0])
    drafter.extend_memory(memory, ids, taps)
    return memory


@torch.no_grad()
def test_one_step_ignores_the_noise_only_when_gated(target):
    ids, taps = torch.randint(0, 111, (2, 6)), torch.randn(2, 6, 2 * 64)
    anchor = torch.randint(0, 111, (2,))
    z1, z2 = torch.randn(2, 4, 64), torch.randn(2, 4, 64)
    for gated in (True, False):
        drafter = make_drafter(target, gated)
        a = drafter.denoise(memory_of(drafter, ids, taps), anchor, z1, 0.0, 1.0)
        b = drafter.denoise(memory_of(drafter, ids, taps), anchor, z2, 0.0, 1.0)
        assert torch.equal(a, b) is gated


@torch.no_grad()
@pytest.mark.parametrize("tau", [0.0, 0.3, 1.0])
def test_gate_equals_the_slot_norm_gain_times_tau(target, tau):
    """Reference: the ungated drafter with slot_norm's gain multiplied by τ computes τ·RMSNorm(·) + slot_pos."""
    gated = make_drafter(target, True)
    plain = make_drafter(target, False)
    plain.slot_norm.weight.mul_(tau)
    ids, taps = torch.randint(0, 111, (1, 5)), torch.randn(1, 5, 2 * 64)
    anchor, z = torch.randint(0, 111, (1,)), torch.randn(1, 4, 64)
    got = gated.denoise(memory_of(gated, ids, taps), anchor, z, tau, 1.0)
    want = plain.denoise(memory_of(plain, ids, taps), anchor, z, tau, 1.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_inference_matches_training_forward(target):
    assert_inference_matches_training(make_drafter(target), torch.tensor([[0.0, 0.3, 0.5], [1.0, 0.0, 0.7]]))


def test_checkpoint_roundtrip_older_configs_and_refusals(target, tmp_path):
    drafter = make_drafter(target)
    assert not fused.fused_supported(drafter)
    drafter.save_pretrained(tmp_path / "src")
    assert FlashMapDrafter.from_pretrained(tmp_path / "src", target).config.tau_gated_input is True
    older = {k: v for k, v in FlashMapConfig(**TINY).to_dict().items() if k != "tau_gated_input"}
    assert FlashMapConfig.from_dict(older).tau_gated_input is False  # configs made before the field
    with pytest.raises(NotImplementedError, match="tau_gated_input"):
        export_flashmap(tmp_path / "src", tmp_path / "dst")


def test_several_draws_or_a_multi_noise_tree_at_one_step_are_refused(target, tmp_path):
    """At 1 step every noise draw drafts the same block: N draws or a multi-noise tree would repeat it N times."""
    from flashmap_ext.draft_shapes.block_tree import block_log_probs
    from flashmap_ext.drafters.load import load_drafter
    make_drafter(target).save_pretrained(tmp_path / "d")
    with pytest.raises(ValueError, match="^draws: 3 noise draws of a tau_gated_input drafter at 1 step"):
        load_drafter(str(tmp_path / "d"), target, draws=3)
    assert load_drafter(str(tmp_path / "d"), target, draws=3, steps=2).config.draft_draws == 3
    drafter = make_drafter(target)
    memory = memory_of(drafter, torch.randint(0, 111, (1, 5)), torch.randn(1, 5, 2 * 64))
    anchor, pos, seed = torch.tensor([3]), torch.tensor([5]), torch.tensor([0])
    assert block_log_probs(drafter, memory, anchor, pos, seed, 0).shape[0] == 4  # the first draw is fine
    with pytest.raises(ValueError, match="multi-noise trees need 2 steps"):
        block_log_probs(drafter, memory, anchor, pos, seed, 1)
