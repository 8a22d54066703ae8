"""The drafter context window (common/window.py, DESIGN.md §5.6) of FlashMap and DFlash.

References: with W >= the context, the unlimited drafter (bit-identical); with W < the context, the
computation on the last W entries rebased to positions 0..W−1 in float64 (DFlash: the module-independent
fp64 oracle of test_dflash_drafter; FlashMap: the unlimited drafter cast to float64, fed the truncated
taps), and plain greedy decoding for the loop (T = 0).
"""
import copy
import json
from pathlib import Path

import pytest
import torch
from test_dflash_drafter import D, inference_logits, released_weights, write_released
from test_dflash_drafter import oracle_logits as dflash_oracle

from conftest import tiny_qwen3
from flashmap_ext.drafters.common.window import check_window, visible_context, window_start
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, fused
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.drafters.load import load_drafter
from flashmap_ext.speculate import generate
from support.drafter_doubles import greedy_continuation, random_flashmap
from support.loop_helpers import prompt_of

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2))


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(hidden_size=D)


def flashmap(target, window=None):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY, context_window=window)
    drafter.reset_parameters(zero_init=False)
    return drafter.eval()


def taps_of(drafter, length, batch=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    width = len(drafter.target_layer_ids) * drafter.config.d_target
    return torch.randn(batch, length, width, generator=g, dtype=torch.float64).to(drafter.dtype)


def memory_of(drafter, taps, chunks):
    memory = drafter.new_memory(taps.shape[0])
    start = 0
    for n in chunks:
        ids = torch.zeros(taps.shape[0], n, dtype=torch.int64)
        drafter.extend_memory(memory, ids, taps[:, start:start + n])
        start += n
    return memory


def noise_of(drafter, batch, seed=2):
    g = torch.Generator().manual_seed(seed)
    return drafter.noise_from_xi(torch.randn(batch, drafter.config.block_size, drafter.config.d_target, generator=g))


def copy_with(drafter, target, window, dtype=None):
    other = copy.deepcopy(drafter)
    other.config.context_window = window
    if dtype is not None:
        other = other.to(dtype)
    return other.attach_target(target)


def test_window_helpers():
    assert [window_start(n, None) for n in (0, 5)] == [0, 0]
    assert [window_start(n, 3) for n in (0, 2, 3, 7)] == [0, 0, 0, 4]
    vis = visible_context(torch.tensor([[0, 2, 6, -1]]), 7, 3)[0]
    assert vis.tolist() == [[False] * 7, [True, True] + [False] * 5, [False] * 3 + [True] * 3 + [False],
                            [False] * 7]
    assert visible_context(torch.tensor([[6]]), 7, None)[0, 0].tolist() == [True] * 6 + [False]
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(ValueError, match="context_window"):
            check_window(bad)


# --- FlashMap ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [1, 2])
def test_flashmap_window_covering_the_context_is_bit_identical(target, steps):
    base = flashmap(target)
    taps, z, anchor = taps_of(base, 11), noise_of(base, 2), torch.tensor([3, 9])
    want = draft_flashmap(base, memory_of(base, taps, [5, 6]), anchor, steps=steps, noise=z, return_logits=True)
    for window in (11, 12, 400):  # the same object (a copy would not be bitwise: DESIGN.md §12)
        base.config.context_window = window
        got = draft_flashmap(base, memory_of(base, taps, [5, 6]), anchor, steps=steps, noise=z, return_logits=True)
        assert torch.equal(got.logits, want.logits) and torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("window", [1, 7])
def test_flashmap_window_equals_float64_rebased_reference(target, steps, window):
    windowed = flashmap(target, window)
    taps, z, anchor = taps_of(windowed, 40), noise_of(windowed, 2), torch.tensor([3, 9])
    got = draft_flashmap(windowed, memory_of(windowed, taps, [30, 3, 7]), anchor, steps=steps, noise=z,
                      return_logits=True).logits
    ref = copy_with(windowed, target, None, torch.float64)  # the last W taps at positions 0..W−1, anchor at W
    want = draft_flashmap(ref, memory_of(ref, taps[:, -window:].double(), [window]), anchor, steps=steps,
                       noise=z.double(), return_logits=True).logits
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4, rtol=1e-4)
    unlimited = copy_with(windowed, target, None)
    full = draft_flashmap(unlimited, memory_of(unlimited, taps, [40]), anchor, steps=steps, noise=z,
                       return_logits=True).logits
    assert (full - got).abs().max() > 1e-3  # the window changes what the drafter sees


def test_flashmap_training_forward_uses_the_same_window(target):
    window = 3
    drafter = flashmap(target, window)
    taps, ids = taps_of(drafter, 12), torch.randint(0, 111, (2, 12))
    anchor_pos = torch.tensor([[0, 2, 5, 11], [9, 3, 7, 1]])
    z = torch.stack([noise_of(drafter, 4, seed=b) for b in range(2)])
    tau_s, tau_t = torch.full((2, 4), 0.0), torch.full((2, 4), 1.0)
    train = drafter.forward_train(taps, ids, anchor_pos, z, tau_s, tau_t)
    for b in range(2):
        for a, p in enumerate(anchor_pos[b].tolist()):
            memory = memory_of(drafter, taps[b:b + 1, :p], [p] if p else [])
            ref = drafter.denoise(memory, ids[b, p:p + 1], z[b, a:a + 1], tau_s[b, a:a + 1], tau_t[b, a:a + 1])
            torch.testing.assert_close(train[b, a], ref[0], atol=1e-5, rtol=1e-5)
    drafter.config.context_window = None  # the same object, unlimited and then covering the context
    unlimited = drafter.forward_train(taps, ids, anchor_pos, z, tau_s, tau_t)
    drafter.config.context_window = 12
    assert torch.equal(drafter.forward_train(taps, ids, anchor_pos, z, tau_s, tau_t), unlimited)


@pytest.mark.parametrize("steps", [1, 2])
def test_flashmap_fused_step_reads_the_same_window(steps):
    target = tiny_qwen3(vocab_size=300, hidden_size=64)
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, n_layers=2, width=128, heads=2, block_size=16, cond_dim=64,
                                         target_layer_ids=(0, 2), context_window=5)
    drafter.reset_parameters(zero_init=False)
    drafter.eval()
    packed = fused.pack_weights(drafter)
    taps, z, anchor = taps_of(drafter, 23, 3), noise_of(drafter, 3), torch.tensor([1, 50, 200])
    ids = torch.zeros(3, 23, dtype=torch.int64)
    ref_mem, fused_mem = memory_of(drafter, taps, [23]), drafter.new_memory(3)
    fused.fused_extend_memory(packed, fused_mem, ids, taps)
    r = draft_flashmap(drafter, ref_mem, anchor, steps=steps, noise=z, return_logits=True)
    f = fused.fused_draft_block(packed, fused_mem, anchor, steps=steps, noise=z, return_logits=True)
    torch.testing.assert_close(f.logits, r.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(f.tokens, r.tokens)


def test_export_overwrites_an_earlier_export_only(target, tmp_path):
    """Rerunning an export replaces it; a folder holding a drafter (the source itself included) is refused untouched."""
    from flashmap_ext.integrations.vllm.export import export_flashmap
    flashmap(target, 6).save_pretrained(tmp_path / "w")
    source_config = (tmp_path / "w" / "config.json").read_text()
    export_flashmap(tmp_path / "w", tmp_path / "vllm", unwindowed=True)
    export_flashmap(tmp_path / "w", tmp_path / "vllm", unwindowed=True, seed=3)
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["flashmap_seed"] == 3
    for dst in (tmp_path / "w", tmp_path / "other"):
        flashmap(target, None).save_pretrained(tmp_path / "other")
        held = (dst / "config.json").read_text()
        with pytest.raises(FileExistsError, match="dst: .* holds a FlashMap drafter checkpoint, not an export for"):
            export_flashmap(tmp_path / "w", dst, unwindowed=True)
        assert (dst / "config.json").read_text() == held
    assert (tmp_path / "w" / "config.json").read_text() == source_config
    for kwargs, error in (({"max_position_embeddings": 0}, ValueError), ({"seed": -1}, ValueError),
                          ({"seed": 1.5}, TypeError)):
        with pytest.raises(error, match=next(iter(kwargs))):
            export_flashmap(tmp_path / "w", tmp_path / "bad", unwindowed=True, **kwargs)
    assert not (tmp_path / "bad").exists()


def test_flashmap_config_records_the_window(target, tmp_path):
    drafter = flashmap(target, 6)
    drafter.save_pretrained(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "config.json").read_text())["context_window"] == 6
    assert FlashMapDrafter.from_pretrained(tmp_path / "w", target).config.context_window == 6
    assert load_drafter(str(tmp_path / "w"), target, context_window=None).config.context_window is None
    assert load_drafter(str(tmp_path / "w"), target, context_window=9).config.context_window == 9
    from flashmap_ext.integrations.vllm.export import export_flashmap
    with pytest.raises(NotImplementedError, match="context_window=6 is not served by vLLM"):
        export_flashmap(tmp_path / "w", tmp_path / "vllm")
    export_flashmap(tmp_path / "w", tmp_path / "vllm", unwindowed=True)
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["flashmap_config"]["context_window"] is None
    committed = json.loads((Path(__file__).resolve().parents[2] / "checkpoints" / "flashmap-map-qwen2.5-coder-0.5b"
                           / "config.json").read_text())
    assert FlashMapConfig.from_dict(committed).context_window == 384  # its training crop (checkpoints/README.md)
    del committed["context_window"]  # a config written before the window: unlimited, as then
    assert FlashMapConfig.from_dict(committed).context_window is None
    with pytest.raises(ValueError, match="context_window"):
        FlashMapConfig(**TINY, context_window=0)


# --- DFlash ------------------------------------------------------------------------------------------
@pytest.fixture
def dflash(tmp_path, target):
    return DFlashDrafter.from_pretrained(write_released(tmp_path / "ckpt"), target)


def dflash_ctx(t, seed=2, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 100, (batch, t), generator=g), torch.randn(batch, t, 3 * D, generator=g)


def dflash_logits(drafter, ids, taps, anchor, chunks):
    memory = drafter.new_memory(1)
    start = 0
    for n in chunks:
        drafter.extend_memory(memory, ids[:, start:start + n], taps[:, start:start + n])
        start += n
    return drafter.draft_logits(memory, torch.tensor([anchor]), torch.tensor([start]))[0]


def test_dflash_window_covering_the_context_is_bit_identical(dflash):
    ids, taps = dflash_ctx(13)
    want = dflash_logits(dflash, ids, taps, 7, [6, 7])
    for window in (13, 14, 1000):
        dflash.config.context_window = window
        assert torch.equal(dflash_logits(dflash, ids, taps, 7, [6, 7]), want)


@pytest.mark.parametrize("window", [1, 5])
def test_dflash_window_equals_float64_rebased_oracle(dflash, target, window):
    ids, taps = dflash_ctx(30)
    full = dflash_logits(dflash, ids, taps, 7, [20, 10])
    dflash.config.context_window = window
    got = dflash_logits(dflash, ids, taps, 7, [20, 10])
    want = dflash_oracle(released_weights(), target, taps[0, -window:], 7, window)  # positions 0..W−1, anchor W
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-4)
    assert (full - got).abs().max() > 1e-3


def test_dflash_training_forward_uses_the_same_window(dflash):
    dflash.config.context_window = 4
    ids, taps = dflash_ctx(12, batch=2)
    anchors = torch.tensor([[0, 3, 4, 11], [2, -1, 9, 5]])
    logits = dflash.forward_train(taps, ids, anchors)
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            if a < 0:
                continue
            torch.testing.assert_close(logits[b, j], inference_logits(dflash, ids[b], taps[b], a),
                                       atol=1e-5, rtol=1e-5)


def test_dflash_config_records_the_window(dflash, target, tmp_path):
    assert dflash.config.context_window is None
    dflash.save_pretrained(tmp_path / "plain")
    assert "context_window" not in json.loads((tmp_path / "plain" / "config.json").read_text())["dflash_config"]
    dflash.config.context_window = 8
    dflash.save_pretrained(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "config.json").read_text())["dflash_config"]["context_window"] == 8
    assert DFlashDrafter.from_pretrained(tmp_path / "w", target).config.context_window == 8
    from flashmap_ext.integrations.vllm.export import export_dflash
    with pytest.raises(NotImplementedError, match="context_window=8 is not served by vLLM"):
        export_dflash(tmp_path / "w", tmp_path / "vllm")
    export_dflash(tmp_path / "w", tmp_path / "vllm", unwindowed=True)
    assert "context_window" not in json.loads((tmp_path / "vllm" / "config.json").read_text())["dflash_config"]


# --- the loop ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_greedy_with_a_window_is_identical_to_plain_greedy(kind):
    model = tiny_qwen3()
    if kind == "flashmap":
        drafter = random_flashmap(model, 4, (1, 2))
    else:
        torch.manual_seed(1)
        drafter = DFlashDrafter.for_target(model, mask_token_id=110, block_size=5, num_hidden_layers=2,
                                           target_layer_ids=[1, 2])
    drafter.config.context_window = 6
    prompt = prompt_of(40)
    out = generate(model, drafter, prompt, 13)
    assert out.tokens == greedy_continuation(model, list(prompt), 13).tolist()
