"""FlashMap DiT drafter: shapes, memory cache, training/inference agreement, anchor causality,
draft_flashmap (1 and 2 steps, shared seeded noise), checkpoints, torch.compile, protocol, errors."""
import copy
import json

import pytest
import torch
from safetensors import safe_open

from conftest import HAS_CUDA, tiny_qwen3
from flashmap_ext.drafters.common.base import BlockDrafter
from flashmap_ext.drafters.flashmap import DraftBlock, FlashMapConfig, FlashMapDrafter, flow
from flashmap_ext.drafters.flashmap.config import default_tap_layers
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from support.numerics import assert_close_to_reference

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2))


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_drafter(target, seed=0, **overrides):
    torch.manual_seed(seed)
    drafter = FlashMapDrafter.for_target(target, **{**TINY, **overrides})
    drafter.reset_parameters(zero_init=False)  # random adaLN: every input influences the output
    return drafter.eval()


def rand_taps(batch, length, drafter, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, len(drafter.target_layer_ids) * drafter.config.d_target, generator=g)


def rand_noise(batch, drafter, seed=2):
    g = torch.Generator().manual_seed(seed)
    return drafter.noise_from_xi(torch.randn(batch, drafter.config.block_size, drafter.config.d_target, generator=g))


def filled_memory(drafter, taps, chunks=None):
    memory = drafter.new_memory(taps.shape[0])
    start = 0
    for n in chunks or [taps.shape[1]]:
        ids = torch.zeros(taps.shape[0], n, dtype=torch.int64)
        drafter.extend_memory(memory, ids, taps[:, start:start + n])
        start += n
    return memory


def test_default_config_is_about_half_a_billion_parameters():
    with torch.device("meta"):
        drafter = FlashMapDrafter(FlashMapConfig())
    total = sum(p.numel() for p in drafter.parameters())
    per_layer = sum(p.numel() for p in drafter.blocks[0].parameters())
    w, cond = 2048, 256  # self-attn 4w², cross-attn 4w², MLP 8w², adaLN cond·9w (biases/norms aside)
    assert per_layer == pytest.approx(16 * w * w + 9 * cond * w, rel=1e-3)
    assert total == pytest.approx(6 * per_layer + (5 + 3) * 4096 * w, rel=1e-2)
    assert 0.49e9 < total < 0.51e9


def test_tap_layers_spread_from_1_to_l_minus_3():
    assert default_tap_layers(36) == (1, 9, 17, 25, 33)
    assert default_tap_layers(28) == (1, 7, 13, 19, 25)
    assert default_tap_layers(4) == (1,) and default_tap_layers(2) == (1,) and default_tap_layers(1) == (0,)


def test_for_target_reads_the_target_config(target):
    drafter = FlashMapDrafter.for_target(target, n_layers=1, width=16, heads=2, block_size=3, cond_dim=8)
    c = drafter.config
    assert (c.d_target, c.vocab_size, c.target_layer_ids) == (64, 111, (1,))
    assert drafter.num_draft_tokens == 3 and isinstance(drafter, BlockDrafter)


def test_shapes_and_protocol(target):
    drafter = make_drafter(target)
    taps = rand_taps(3, 6, drafter)
    memory = filled_memory(drafter, taps)
    tokens = drafter.draft(memory, torch.tensor([1, 2, 3]), num_tokens=3, seed=torch.tensor([0, 1, 2]),
                           position=torch.tensor([6, 6, 6]))
    assert tokens.shape == (3, 3) and tokens.dtype == torch.int64
    assert ((tokens >= 0) & (tokens < 111)).all()
    assert drafter.draft(memory, torch.tensor([1, 2, 3]), num_tokens=0, seed=0, position=6).shape == (3, 0)
    out = draft_flashmap(drafter, memory, torch.tensor([1, 2, 3]), seed=0, position=6, return_logits=True)
    assert isinstance(out, DraftBlock) and out.logits.shape == (3, 4, 111) and out.logits.dtype == torch.float32
    logits = drafter.forward_train(taps, torch.randint(0, 111, (3, 6)), torch.tensor([[0, 5]] * 3),
                                   torch.randn(3, 2, 4, 64), torch.rand(3, 2), torch.rand(3, 2))
    assert logits.shape == (3, 2, 4, 111)


def test_incremental_memory_equals_recompute(target):
    drafter = make_drafter(target)
    taps = rand_taps(2, 70, drafter)  # crosses the initial capacity of 64 entries
    whole, chunked = filled_memory(drafter, taps), filled_memory(drafter, taps, [30, 1, 39])
    assert whole.length == chunked.length == 70
    assert torch.allclose(whole.k[:, :, :, :70], chunked.k[:, :, :, :70], atol=1e-6)
    anchor, z = torch.tensor([5, 9]), rand_noise(2, drafter)
    a = draft_flashmap(drafter, whole, anchor, noise=z, return_logits=True).logits
    b = draft_flashmap(drafter, chunked, anchor, noise=z, return_logits=True).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_inference_matches_training_forward(target):
    drafter = make_drafter(target)
    taps, ids = rand_taps(2, 9, drafter), torch.randint(0, 111, (2, 9))
    anchor_pos = torch.tensor([[0, 4, 8], [3, 7, 1]])
    z = torch.stack([rand_noise(3, drafter, seed=b) for b in range(2)])  # [B, A, K, d]
    tau_s, tau_t = torch.tensor([[0.0, 0.3, 0.5]] * 2), torch.tensor([[1.0, 0.4, 0.9]] * 2)
    train = drafter.forward_train(taps, ids, anchor_pos, z, tau_s, tau_t)
    for b in range(2):
        for a, p in enumerate(anchor_pos[b].tolist()):
            memory = filled_memory(drafter, taps[b:b + 1, :p]) if p else drafter.new_memory(1)
            ref = drafter.denoise(memory, ids[b, p:p + 1], z[b, a:a + 1], tau_s[b, a:a + 1], tau_t[b, a:a + 1])
            assert torch.allclose(train[b, a], ref[0], atol=1e-5), (b, a, p)


def test_block_sees_nothing_at_or_after_its_anchor(target):
    drafter = make_drafter(target)
    taps, ids = rand_taps(2, 12, drafter), torch.randint(0, 111, (2, 12))
    anchor_pos = torch.tensor([[5, 9], [2, 11]])
    args = (torch.randn(2, 2, 4, 64), torch.rand(2, 2), torch.rand(2, 2))
    base = drafter.forward_train(taps, ids, anchor_pos, *args)
    late_taps, late_ids = taps.clone(), ids.clone()
    late_taps[0, 5:] += 10 * torch.randn_like(late_taps[0, 5:])  # at/after row 0's first anchor (5)
    late_ids[0, 6:] = (late_ids[0, 6:] + 1) % 111  # after it (id 9 is the second anchor's token)
    out = drafter.forward_train(late_taps, late_ids, anchor_pos, *args)
    assert torch.allclose(out[0, 0], base[0, 0], atol=1e-6), "block must not see taps at/after its anchor"
    assert not torch.allclose(out[0, 1], base[0, 1], atol=1e-3), "later anchor sees them: test can fail"
    assert torch.equal(out[1], base[1]), "other rows are untouched"
    early = taps.clone()
    early[0, 4] += 10 * torch.randn_like(early[0, 4])  # just before the anchor: must matter
    assert not torch.allclose(drafter.forward_train(early, ids, anchor_pos, *args)[0, 0], base[0, 0], atol=1e-3)
    anchor_changed = ids.clone()
    anchor_changed[0, 5] = (anchor_changed[0, 5] + 1) % 111
    assert not torch.allclose(drafter.forward_train(taps, anchor_changed, anchor_pos, *args)[0, 0], base[0, 0],
                              atol=1e-3), "the anchor's embedding must matter"


def test_draft_block_one_and_two_steps(target):
    drafter = make_drafter(target)
    memory, anchor, z = filled_memory(drafter, rand_taps(2, 5, drafter)), torch.tensor([7, 8]), rand_noise(2, drafter)
    one = draft_flashmap(drafter, memory, anchor, steps=1, noise=z, return_logits=True)
    assert torch.allclose(one.logits, drafter.denoise(memory, anchor, z, 0.0, 1.0))
    assert torch.equal(one.tokens, one.logits.argmax(-1))
    two = draft_flashmap(drafter, memory, anchor, steps=2, noise=z, return_logits=True)
    t_mid = flow.t_of_tau(0.5, 111).item()
    assert drafter.t_mid == pytest.approx(t_mid) and 0.5 < t_mid < 0.75
    probs = torch.softmax(drafter.denoise(memory, anchor, z, 0.0, 0.5), -1)
    x_mid = (1 - t_mid) * z + t_mid * probs @ target.get_input_embeddings().weight  # same noise, no fresh draw
    assert torch.allclose(two.logits, drafter.denoise(memory, anchor, x_mid, 0.5, 1.0), atol=1e-5)
    assert not torch.allclose(one.logits, two.logits, atol=1e-3)
    assert one.logits.abs().max() <= drafter.config.softcap


def test_seeded_noise_is_reproducible_and_row_independent(target):
    drafter = make_drafter(target)
    taps = rand_taps(2, 6, drafter)
    memory, anchor = filled_memory(drafter, taps), torch.tensor([3, 4])
    seed, pos = torch.tensor([11, 12]), torch.tensor([6, 6])
    for steps in (1, 2):
        a = draft_flashmap(drafter, memory, anchor, steps=steps, seed=seed, position=pos, return_logits=True)
        b = draft_flashmap(drafter, memory, anchor, steps=steps, noise=drafter.sample_noise(seed, pos), return_logits=True)
        assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.logits, b.logits)
    alone = draft_flashmap(drafter, filled_memory(drafter, taps[1:]), anchor[1:], steps=2, seed=seed[1:], position=pos[1:],
                        return_logits=True)
    assert torch.allclose(alone.logits[0], a.logits[1], atol=1e-5), "a row must not depend on batch-mates"
    other = draft_flashmap(drafter, memory, anchor, steps=2, noise=drafter.sample_noise(seed, pos + 1), return_logits=True)
    assert not torch.allclose(other.logits, a.logits)
    z = drafter.sample_noise(seed, pos)
    assert z.shape == (2, 4, 64) and z.dtype == torch.float32


def test_zero_init_starts_uniform_and_trains(target):
    drafter = FlashMapDrafter.for_target(target, **TINY)
    logits = drafter.forward_train(rand_taps(1, 5, drafter), torch.zeros(1, 5, dtype=torch.int64),
                                   torch.tensor([[3]]), torch.randn(1, 1, 4, 64), torch.rand(1, 1), torch.rand(1, 1))
    assert torch.equal(logits, torch.zeros_like(logits)), "adaLN-Zero: the drafter starts at uniform logits"
    logits.logsumexp(-1).sum().backward()
    assert drafter.final.out.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.dtype == p.dtype for p in drafter.parameters())
    assert target.get_input_embeddings().weight.grad is None and target.lm_head.weight.grad is None


def test_slot_positions_are_on_the_scale_of_the_slot_state(target):
    """At τ = 0 a slot's input is pure noise, so its identity is the slot-position embedding alone: a fresh
    drafter draws it at the scale of the RMS-normalised state it is added to (at std 0.02 it was ~3 %
    of the slot token, and the testbed's flow model drafted +0.20 γ better at T = 0 with std 1)."""
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY)
    state = drafter.slot_norm(drafter.slot_proj(rand_noise(64, drafter))).double()
    state_rms = state.pow(2).mean(-1).sqrt()  # [64, K]
    pos_rms = drafter.slot_pos.detach().double().pow(2).mean(-1).sqrt()  # [K]
    assert torch.allclose(state_rms, torch.ones_like(state_rms), atol=1e-3)  # RMSNorm with its unit gain
    assert (pos_rms > 0.5).all() and (pos_rms < 2.0).all(), pos_rms


def test_flow_model_ignores_tau_t(target):
    drafter = make_drafter(target, two_time=False)
    assert drafter.t_embedder is None
    args = (rand_taps(1, 5, drafter), torch.zeros(1, 5, dtype=torch.int64), torch.tensor([[3]]), torch.randn(1, 1, 4, 64))
    s = torch.tensor([[0.3]])
    assert torch.equal(drafter.forward_train(*args, s, s), drafter.forward_train(*args, s, torch.tensor([[0.9]])))


def test_save_load_roundtrip_without_target_tensors(target, tmp_path):
    drafter = make_drafter(target)
    drafter.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k).numel() for k in f.keys()}
    assert sum(stored.values()) == sum(p.numel() for p in drafter.parameters()), "embedding/head never stored"
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "flashmap_drafter"
    loaded = FlashMapDrafter.from_pretrained(tmp_path, target).eval()
    assert loaded.config == drafter.config
    assert loaded.tables.embedding.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    assert_draft_like_float64(target, drafter, loaded)


def assert_draft_like_float64(target, *drafters):
    """Each drafter (equal weights) drafts the tokens of a float64 copy of the first and logits within
    its dtype's tolerance: two objects are compared with the reference, not bitwise (DESIGN.md §12)."""
    taps, anchor, z = rand_taps(2, 5, drafters[0]), torch.tensor([1, 2]), rand_noise(2, drafters[0])
    ref = copy.deepcopy(drafters[0]).double().attach_target(target)
    want = draft_flashmap(ref, filled_memory(ref, taps.double()), anchor, noise=z.double(), return_logits=True)
    for m in drafters:
        got = draft_flashmap(m, filled_memory(m, taps), anchor, noise=z, return_logits=True)
        assert_close_to_reference(got.logits, want.logits)
        assert torch.equal(got.tokens, want.tokens)


def test_two_loads_of_one_file_draft_alike(target, tmp_path):
    """Loaders keep the file's storage (DESIGN.md §12): two loads of one file agree with its reference."""
    make_drafter(target).save_pretrained(tmp_path)
    assert_draft_like_float64(target, *(FlashMapDrafter.from_pretrained(tmp_path, target) for _ in range(2)))


def test_draft_vocabulary_subset(target, tmp_path):
    drafter = make_drafter(target, draft_vocab_size=20)
    keep = torch.arange(5, 105, 5)  # 20 target ids
    drafter.set_draft_vocab(keep, target)
    assert torch.equal(drafter.to_target_ids(torch.arange(20)), keep)
    labels = torch.tensor([10, 11, -100, 100])
    assert drafter.to_state_ids(labels).tolist() == [1, -100, -100, 19]
    memory = filled_memory(drafter, rand_taps(2, 5, drafter))
    out = draft_flashmap(drafter, memory, torch.tensor([1, 2]), seed=0, position=5, steps=2, return_logits=True)
    assert out.logits.shape == (2, 4, 20) and torch.isin(out.tokens, keep).all()
    assert drafter.noise_factor.shape == (64, 64)
    drafter.save_pretrained(tmp_path)
    assert torch.equal(FlashMapDrafter.from_pretrained(tmp_path, target).d2t, drafter.d2t)


def _compile_check(drafter, device, backend):
    drafter = drafter.to(device)
    memory = filled_memory(drafter, rand_taps(2, 7, drafter).to(device))
    anchor, z = torch.tensor([3, 4], device=device), rand_noise(2, drafter).to(device)
    compiled = torch.compile(draft_flashmap, backend=backend, fullgraph=True)
    for steps in (1, 2):
        ref = draft_flashmap(drafter, memory, anchor, steps=steps, noise=z, return_logits=True)
        out = compiled(drafter, memory, anchor, steps=steps, noise=z, return_logits=True)
        assert torch.allclose(out.logits, ref.logits, atol=1e-4) and torch.equal(out.tokens, ref.tokens)


def test_draft_block_under_torch_compile(target):
    torch._dynamo.reset()
    _compile_check(make_drafter(target), "cpu", "aot_eager")  # dynamo capture, full graph, no C++ build


@pytest.mark.slow
def test_draft_block_under_inductor_cpu(target):
    torch._dynamo.reset()
    _compile_check(make_drafter(target), "cpu", "inductor")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_draft_block_under_inductor_cuda():
    target = tiny_qwen3().cuda()
    torch._dynamo.reset()
    _compile_check(make_drafter(target), "cuda", "inductor")


def test_clear_errors_name_the_argument(target):
    drafter = make_drafter(target)
    memory = filled_memory(drafter, rand_taps(2, 5, drafter))
    anchor = torch.tensor([1, 2])
    cases = [
        ("anchor_tokens", lambda: draft_flashmap(drafter, memory, torch.tensor([1]), seed=0, position=5)),
        ("anchor_tokens", lambda: draft_flashmap(drafter, memory, anchor.int(), seed=0, position=5)),
        # an int anchor read "got None int"
        (r"anchor_tokens: expected a \[B=2\] int64 tensor \(each row's last committed token id\), got int 5$",
         lambda: draft_flashmap(drafter, memory, 5, seed=0, position=5)),
        (r"got a tensor of shape \[2, 1\] and dtype torch.int64$",
         lambda: draft_flashmap(drafter, memory, anchor[:, None], seed=0, position=5)),
        ("steps", lambda: draft_flashmap(drafter, memory, anchor, steps=3, seed=0, position=5)),
        # an id outside the target's vocabulary was a bare 'IndexError: index out of range in self'
        (r"anchor_tokens: expected ids in \[0, 111\)", lambda: draft_flashmap(drafter, memory, torch.tensor([1, 111]),
                                                                           seed=0, position=5)),
        (r"anchor_tokens: expected ids in \[0, 111\)", lambda: draft_flashmap(drafter, memory, torch.tensor([-1, 2]),
                                                                           seed=0, position=5)),
        ("seed, position", lambda: draft_flashmap(drafter, memory, anchor)),
        ("position", lambda: draft_flashmap(drafter, memory, anchor, seed=0, position=torch.tensor([5.0, 6.0]))),
        ("position", lambda: draft_flashmap(drafter, memory, anchor, seed=0, position=torch.tensor([5, 6, 7]))),
        ("seed", lambda: draft_flashmap(drafter, memory, anchor, seed=torch.zeros(2, 2, dtype=torch.int64), position=5)),
        ("noise", lambda: draft_flashmap(drafter, memory, anchor, noise=torch.zeros(2, 4, 63))),
        ("num_tokens", lambda: drafter.draft(memory, anchor, num_tokens=5, seed=0, position=5)),
        ("taps", lambda: drafter.extend_memory(memory, torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, 64))),
        ("taps", lambda: drafter.extend_memory(memory, torch.zeros(2, 3, dtype=torch.int64), None)),
        ("token_ids", lambda: drafter.extend_memory(memory, torch.zeros(3, 3, dtype=torch.int64),
                                                    torch.zeros(3, 3, 128))),
        ("anchor_pos", lambda: drafter.forward_train(torch.zeros(1, 5, 128), torch.zeros(1, 5, dtype=torch.int64),
                                                     torch.tensor([[2]], dtype=torch.int32), torch.zeros(1, 1, 4, 64),
                                                     torch.zeros(1, 1), torch.zeros(1, 1))),
        ("slot_inputs", lambda: drafter.forward_train(torch.zeros(1, 5, 128), torch.zeros(1, 5, dtype=torch.int64),
                                                      torch.tensor([[2]]), torch.zeros(1, 1, 3, 64),
                                                      torch.zeros(1, 1), torch.zeros(1, 1))),
        ("heads", lambda: FlashMapConfig(width=30, heads=4)),
        ("target", lambda: FlashMapDrafter(FlashMapConfig(**{**TINY, "d_target": 32, "vocab_size": 111}), target)),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=name):
            call()
    with pytest.raises(RuntimeError, match="attach_target"):
        FlashMapDrafter(FlashMapConfig(**{**TINY, "d_target": 64, "vocab_size": 111})).sample_noise(
            torch.tensor([0]), torch.tensor([0]))


@pytest.mark.parametrize("field, value, rule", [("draft_steps", 3, "1 or 2"), ("draft_draws", 0, ">= 1"),
                                                ("heads", 5, "must divide width=64 into heads of an even dimension")])
def test_an_invalid_config_field_is_named_with_its_rule(field, value, rule):
    with pytest.raises(ValueError, match=rf"^FlashMapConfig: invalid {field}={value} \(expected {rule}\)$"):
        FlashMapConfig(**{"width": 64, "heads": 4, field: value})
