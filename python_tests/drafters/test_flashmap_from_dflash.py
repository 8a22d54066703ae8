"""A qwen3-trunk flow model started from a DFlash drafter (`train flow --init-from <DFlash>`): with one layer its
one-step draft logits are DFlash's (the anchor's keys only differ from the second layer on), the layers copy
over, and the drafters it cannot start are refused with the reason."""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap.from_dflash import start_from_dflash
from flashmap_ext.train.warm_start import warm_start

K, TAPS = 4, (0, 2)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def pair(target, layers=1, **fields):
    torch.manual_seed(2)
    dflash = DFlashDrafter.for_target(target, mask_token_id=110, block_size=K + 1, num_hidden_layers=layers,
                                      target_layer_ids=list(TAPS), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in dflash.parameters():  # norms away from 1, so a wrongly mapped gain shows
            p.add_(0.3 * torch.randn_like(p))
    c = dflash.config
    shape = dict(n_layers=layers, width=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                 mlp_ratio=c.intermediate_size / c.hidden_size, block_size=K, target_layer_ids=TAPS, trunk="qwen3",
                 two_time=False, tau_gated_input=True, softcap=0.0, rope_theta=c.rope_theta)
    flow = FlashMapDrafter.for_target(target, **{**shape, **fields}, init="random").eval()
    return dflash, flow


@torch.no_grad()
def test_one_layer_draft_logits_are_dflash(target):
    dflash, flow = pair(target)
    start_from_dflash(flow, dflash)
    ids, taps = torch.tensor([[5, 9, 17, 33, 2, 71]]), torch.randn(1, 6, len(TAPS) * 64)
    mem_d, mem_f = dflash.new_memory(1), flow.new_memory(1)
    dflash.extend_memory(mem_d, ids, taps)
    flow.extend_memory(mem_f, ids, taps)
    anchor, pos = torch.tensor([40]), torch.tensor([6])
    want = dflash.vocab_logits(dflash.block_hidden(mem_d, anchor, pos))
    noise = torch.randn(1, K, 64)  # gated away at τ = 0
    got = flow.denoise(mem_f, anchor, noise, 0.0, 1.0)
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)


def test_layers_copy_over_and_warm_start_dispatches(target, tmp_path):
    dflash, flow = pair(target, layers=2)
    dflash.save_pretrained(tmp_path / "dflash")
    warm_start(flow, str(tmp_path / "dflash"), target)
    for mine, theirs in zip(flow.blocks, dflash.layers):
        assert torch.equal(mine.attn.k_proj.weight, theirs.self_attn.k_proj.weight)
        assert torch.equal(mine.mlp.down_proj.weight, theirs.mlp.down_proj.weight)
        assert torch.equal(mine.post_norm.weight, theirs.post_attention_layernorm.weight)
    assert torch.equal(flow.tap_proj.weight, dflash.fc.weight) and torch.equal(flow.final.norm.weight,
                                                                               dflash.norm.weight)


def test_a_dflash_start_takes_another_draft_vocabulary_with_new_draft_vocab(target, tmp_path):
    """--new-draft-vocab reached the flow-checkpoint path only: a DFlash start on another --draft-vocab was
    refused even with it."""
    dflash, _ = pair(target)
    dflash.save_pretrained(tmp_path / "dflash")
    _, flow = pair(target, draft_vocab_size=32)
    flow.set_draft_vocab(torch.arange(32) + 3, target)
    with pytest.raises(ValueError, match=r"draft vocabulary \(all rows\) differs .*--new-draft-vocab"):
        warm_start(flow, str(tmp_path / "dflash"), target)
    warm_start(flow, str(tmp_path / "dflash"), target, new_vocab=True)
    assert torch.equal(flow.tap_proj.weight, dflash.fc.weight)
    assert torch.equal(flow.vocab.target_ids, torch.arange(32) + 3)


@pytest.mark.parametrize("fields, why", [
    (dict(trunk="dit", kv_heads=None, width=64, heads=4), "starts the qwen3 trunk only"),
    (dict(tau_gated_input=False), "--tau-gated-input flow model only"),
    (dict(n_layers=2), "--layers: 1 in the DFlash checkpoint, 2 in this run"),
    (dict(block_size=K + 1), f"--block-size .*: {K} in the DFlash checkpoint, {K + 1} in this run"),
    (dict(n_layers=2, block_size=K + 1), f"--layers: 1 in .* run; --block-size .*: {K} in the DFlash checkpoint"),
])
def test_refusals(target, fields, why):
    dflash, flow = pair(target, **fields)
    with pytest.raises(ValueError, match=why):
        start_from_dflash(flow, dflash)
