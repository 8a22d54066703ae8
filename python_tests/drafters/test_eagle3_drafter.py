"""EAGLE-3 drafter: checkpoint format, chain drafting vs an fp64 full-recompute oracle, cache, TTT, loss.

The oracle treats a drafting chain as what the EAGLE-3 paper describes: one causal sequence of pairs
(hidden, next-token embedding), the last query attending to every earlier pair; recomputed from scratch
at every step (no cache, no masks shared with the module; RoPE as complex rotation).
"""
import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import tiny_qwen3
from flashmap_ext.drafters.common.base import BlockDrafter
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.eagle3.config import eagle3_layer_ids
from flashmap_ext.speculate import generate
from flashmap_ext.train.eagle3 import build_draft_vocab, count_tokens, eagle3_loss
from support.numerics import assert_close_to_reference

D, H, G, HD, INTER, V, VD = 64, 4, 2, 16, 96, 111, 40
TAPS = [1, 3, 5]
DRAFT_IDS = torch.arange(3, 3 + 2 * VD, 2)            # every other id from 3: a real subset with offsets


def specforge_weights(seed=1):
    """Every tensor of a SpecForge `LlamaForCausalLMEagle3` checkpoint, by name."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": (D, len(TAPS) * D), "norm.weight": (D,), "lm_head.weight": (VD, D),
              "midlayer.self_attn.q_proj.weight": (H * HD, 2 * D), "midlayer.self_attn.k_proj.weight": (G * HD, 2 * D),
              "midlayer.self_attn.v_proj.weight": (G * HD, 2 * D), "midlayer.self_attn.o_proj.weight": (D, H * HD),
              "midlayer.mlp.gate_proj.weight": (INTER, D), "midlayer.mlp.up_proj.weight": (INTER, D),
              "midlayer.mlp.down_proj.weight": (D, INTER), "midlayer.hidden_norm.weight": (D,),
              "midlayer.input_layernorm.weight": (D,), "midlayer.post_attention_layernorm.weight": (D,)}
    w = {k: (1 + 0.2 * torch.randn(s, generator=g)) if len(s) == 1 else 0.15 * torch.randn(s, generator=g)
         for k, s in shapes.items()}
    w["lm_head.weight"] *= 6
    w["d2t"] = DRAFT_IDS - torch.arange(VD)
    w["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, DRAFT_IDS, True)
    return w


def write_specforge(path, weights=None, **changes):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": D,
           "intermediate_size": INTER, "num_attention_heads": H, "num_key_value_heads": G, "head_dim": HD,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 1000.0, "rope_scaling": None,
           "max_position_embeddings": 512, "vocab_size": V, "draft_vocab_size": VD, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "float32",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": TAPS, "use_aux_hidden_state": True}, **changes}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    weights = specforge_weights() if weights is None else weights
    save_file({**weights, "embed_tokens.weight": torch.randn(V, D)}, str(path / "model.safetensors"))
    return path


# --- independent fp64 oracle ----------------------------------------------------------------------
def _rms(x, w, eps=1e-6):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta=1000.0):
    half = x.shape[-1] // 2
    ang = pos[:, None].double() * theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    z = torch.complex(x[:, :half], x[:, half:]) * torch.polar(torch.ones_like(ang), ang)
    return torch.cat([z.real, z.imag], -1)


def _last_output(w, emb, hid, pos):
    """Causal layer over pairs (hid [L, d], emb [L, d]) at positions [L]; the last pair's output."""
    p = lambda n: w["midlayer." + n]  # noqa: E731
    x = torch.cat([_rms(emb, p("input_layernorm.weight")), _rms(hid, p("hidden_norm.weight"))], -1)
    heads = []
    for j in range(H):
        qh, kh = slice(j * HD, (j + 1) * HD), slice((j // (H // G)) * HD, (j // (H // G) + 1) * HD)
        q = _rope((x[-1:] @ p("self_attn.q_proj.weight").T)[:, qh], pos[-1:])
        k = _rope((x @ p("self_attn.k_proj.weight").T)[:, kh], pos)
        heads.append(torch.softmax(q @ k.T / math.sqrt(HD), -1) @ (x @ p("self_attn.v_proj.weight").T)[:, kh])
    h = hid[-1:] + torch.cat(heads, -1) @ p("self_attn.o_proj.weight").T
    m = _rms(h, p("post_attention_layernorm.weight"))
    return h + (F.silu(m @ p("mlp.gate_proj.weight").T) * (m @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T


def oracle_chain(w, target, ids, taps, steps):
    """Greedy chain after context ids [n] (anchor = ids[-1]) with taps [n−1, n·d]: (logits, target ids)."""
    w = {k: v.double() for k, v in w.items()}
    emb_table = target.model.embed_tokens.weight.double()
    g = taps.double() @ w["fc.weight"].T
    hid, tok = list(g), list(ids[1:].tolist())                 # pairs (g_s, x_{s+1}), s = 0 … n−2
    logits, drafts = [], []
    for j in range(steps):
        out = _last_output(w, emb_table[tok], torch.stack(hid), torch.arange(len(tok)))[0]
        logits.append(_rms(out, w["norm.weight"]) @ w["lm_head.weight"].T)
        drafts.append(DRAFT_IDS[logits[-1].argmax()].item())
        hid, tok = hid + [out], tok + [drafts[-1]]
    return torch.stack(logits), drafts


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(hidden_size=D, num_layers=6)


@pytest.fixture
def drafter(tmp_path, target):
    return Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "ckpt", num_draft_tokens=5), target)


def _ctx(t, seed=2, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, t), generator=g), torch.randn(batch, t, len(TAPS) * D, generator=g)


def _chain_after(drafter, ids, taps, a, steps, forced=None, chunks=None):
    memory = drafter.new_memory(ids.shape[0])
    start = 0
    for n in chunks or [a]:
        drafter.extend_memory(memory, ids[:, start:start + n], taps[:, start:start + n])
        start += n
    return drafter.chain(memory, ids[:, a], torch.full((ids.shape[0],), a), steps, forced)


def float64_chain(drafter, ids, taps, a, steps):
    """(logits, drafts) of batch row 0 of a float64 copy of `drafter`: the rounding reference of the same
    weights, for drafters the oracle does not describe (for_target: the target's rope_theta)."""
    ref = copy.deepcopy(drafter).double()
    logits, drafts = _chain_after(ref, ids, taps.double(), a, steps)
    return logits[0], drafts[0].tolist()


def assert_chain_like_oracle(drafter, want, ids, taps, a):
    """The drafter's chain after ids[:, :a] (batch 1) against the oracle's (logits, drafts) `want`: the
    drafts exactly, the logits within the drafter dtype's tolerance (two objects with equal weights are
    not bitwise equal: DESIGN.md §12)."""
    logits, drafts = _chain_after(drafter, ids, taps, a, len(want[1]))
    assert_close_to_reference(logits[0], want[0])
    assert drafts[0].tolist() == want[1]


# --- format and drafting ----------------------------------------------------------------------------
def test_eagle3_specforge_checkpoint_drafts_like_oracle(drafter, target):
    assert isinstance(drafter, BlockDrafter) and drafter.num_draft_tokens == 5
    assert torch.equal(drafter.draft_ids, DRAFT_IDS) and tuple(drafter.target_layer_ids) == tuple(TAPS)
    ids, taps = _ctx(9)
    want_logits, want = oracle_chain(specforge_weights(), target, ids[0], taps[0, :8], 5)
    assert_chain_like_oracle(drafter, (want_logits, want), ids, taps, 8)
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids[:, :8], taps[:, :8])
    assert drafter.draft(memory, ids[:, 8], num_tokens=3, position=torch.tensor([8])).tolist() == [want[:3]]


def test_eagle3_save_pretrained_roundtrip(drafter, tmp_path, target):
    drafter.save_pretrained(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == VD
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TAPS and cfg["num_hidden_layers"] == 1
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert set(saved) == set(specforge_weights()), "names differ from SpecForge's (embed_tokens must be absent)"
    assert saved["t2d"].dtype == torch.bool and torch.equal(saved["d2t"], specforge_weights()["d2t"])
    again = Eagle3Drafter.from_pretrained(tmp_path / "out", target)
    ids, taps = _ctx(7)
    want = oracle_chain(specforge_weights(), target, ids[0], taps[0, :6], 4)
    for d in (drafter, again):
        assert_chain_like_oracle(d, want, ids, taps, 6)


def test_eagle3_frozen_lm_head_is_the_targets_rows_and_not_stored(tmp_path, target):
    """frozen_lm_head: head = target LM-head rows of the draft vocabulary, not trained, not saved; loading
    takes it back from the target (and needs one)."""
    draft = torch.tensor([5, 1, 90, 33, 7, 64])
    d = Eagle3Drafter.for_target(target, draft_ids=draft, dtype=torch.float32, intermediate_size=16,
                                 target_layer_ids=TAPS, frozen_lm_head=True)
    head = target.lm_head.weight.detach().float()
    assert torch.equal(d.lm_head.weight, head[draft]) and not d.lm_head.weight.requires_grad
    assert "lm_head.weight" not in {n for n, p in d.named_parameters() if p.requires_grad}
    d.save_pretrained(tmp_path / "frozen")
    assert "lm_head.weight" not in load_file(tmp_path / "frozen" / "model.safetensors")
    again = Eagle3Drafter.from_pretrained(tmp_path / "frozen", target)
    assert again.config.frozen_lm_head and torch.equal(again.lm_head.weight, head[draft])
    ids, taps = _ctx(7)
    want = float64_chain(d, ids, taps, 6, 3)
    for drafter in (d, again):
        assert_chain_like_oracle(drafter, want, ids, taps, 6)
    with pytest.raises(ValueError, match="frozen_lm_head"):
        Eagle3Drafter.from_pretrained(tmp_path / "frozen")


def test_eagle3_incremental_memory_equals_one_shot(drafter):
    ids, taps = _ctx(80, batch=2)
    one = _chain_after(drafter, ids, taps, 75, 4)[0]
    chunked = _chain_after(drafter, ids, taps, 75, 4, chunks=[1, 1, 3, 62, 8])[0]
    torch.testing.assert_close(chunked, one, atol=1e-5, rtol=1e-5)


# --- training-time test -----------------------------------------------------------------------------
def test_eagle3_ttt_matches_teacher_forced_chain(drafter, target):
    ids, taps = _ctx(14, batch=2)
    anchors = torch.tensor([[1, 4, 9, 13], [0, 3, -1, 7]])
    logits = drafter(taps, ids, anchors, steps=4)
    assert logits.shape == (2, 4, 4, VD) and torch.isfinite(logits).all()
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            if a < 1:
                continue
            forced = ids[b:b + 1, (a + 1 + torch.arange(3)).clamp(max=13)]
            want = _chain_after(drafter, ids[b:b + 1], taps[b:b + 1], a, 4, forced)[0][0]
            torch.testing.assert_close(logits[b, j], want, atol=1e-5, rtol=1e-5)


def test_eagle3_ttt_block_ignores_taps_at_or_after_anchor(drafter):
    ids, taps = _ctx(12)
    anchors = torch.tensor([[3, 6, 10]])
    base = drafter(taps, ids, anchors, steps=3)
    moved = taps.clone()
    moved[:, 6:] += 3 * torch.randn_like(moved[:, 6:])
    out = drafter(moved, ids, anchors, steps=3)
    torch.testing.assert_close(out[:, :2], base[:, :2], atol=0, rtol=0)
    assert (out[:, 2] - base[:, 2]).abs().max() > 1e-3
    earlier = taps.clone()
    earlier[:, 5] += 3.0                                  # the pair (g_5, x_6) of anchor 6
    assert (drafter(earlier, ids, anchors, steps=3)[:, 1] - base[:, 1]).abs().max() > 1e-3


def _batch(t=16, seed=3, k=8):
    ids, taps = _ctx(t, seed=seed, batch=2)
    ids = DRAFT_IDS[ids % VD]                             # labels inside the draft vocabulary …
    ids[0, 7] = 4                                         # … except one
    anchors = torch.tensor([[0, 4, 9, 13], [1, 2, 10, -1]])
    pos = anchors[..., None] + 1 + torch.arange(k)
    following = ids.gather(1, pos.clamp(0, t - 1).flatten(1)).view_as(pos)
    labels = torch.where((pos < t) & (anchors[..., None] >= 0), following, -100)
    return {"input_ids": ids, "taps": taps, "anchor_pos": anchors, "labels": labels}


def test_eagle3_loss_matches_hand_computation(drafter):
    batch = _batch()
    loss, metrics = eagle3_loss(drafter, batch, steps=3)
    logp = torch.log_softmax(drafter(batch["taps"], batch["input_ids"], batch["anchor_pos"], steps=3).double(), -1)
    row = {t: r for r, t in enumerate(DRAFT_IDS.tolist())}
    want, count = 0.0, 0
    for j in range(3):
        terms = [-logp[b, a, j, row[y]].item() for b in range(2) for a in range(4)
                 if batch["anchor_pos"][b, a] >= 1 and (y := batch["labels"][b, a, j].item()) in row]
        want += 0.8 ** j * sum(terms) / len(terms)
        count += len(terms)
    assert loss.item() == pytest.approx(want, rel=1e-5) and metrics["tokens"] == count


def test_eagle3_loss_decreases_on_tiny_overfit(drafter, target):
    batch = _batch()
    opt = torch.optim.Adam(drafter.parameters(), lr=5e-3)
    first = None
    for _ in range(20):
        loss, metrics = eagle3_loss(drafter, batch, steps=4)
        first = first or metrics
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert math.isfinite(metrics["loss"]) and metrics["loss"] < 0.3 * first["loss"]
    assert metrics["accept_len"] > first["accept_len"] + 1
    assert target.model.embed_tokens.weight.grad is None


# --- vocabulary, construction, loop, errors -----------------------------------------------------------------
def test_eagle3_draft_vocab_from_counts(target):
    counts = count_tokens([torch.tensor([5, 5, 5, 9, 9, 2]), torch.tensor([7, 9, 2])], V)
    assert counts[5] == 3 and counts[9] == 3 and counts[0] == 0
    assert build_draft_vocab(counts, 3).tolist() == [2, 5, 9]
    assert eagle3_layer_ids(36) == [1, 17, 32]
    d = Eagle3Drafter.for_target(target, draft_ids=build_draft_vocab(counts, 4), num_draft_tokens=3)
    assert d.draft_ids.tolist() == [2, 5, 7, 9] and d.t2d.sum() == 4
    assert d.target_to_draft(torch.tensor([9, 3, -100])).tolist() == [3, -100, -100]  # vocab.IGNORE
    torch.testing.assert_close(d.lm_head.weight, target.lm_head.weight[[2, 5, 7, 9]])


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_random_drafter_is_lossless_in_the_loop(kind, target, drafter):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    d = drafter if kind == "eagle3" else DFlashDrafter.for_target(target, mask_token_id=110, num_hidden_layers=1,
                                                                   block_size=4, target_layer_ids=[1, 4])
    prompt = [5, 17, 3, 99, 42]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(10):
            ids = torch.cat([ids, target(ids).logits[:, -1:].argmax(-1)], 1)
    out = generate(target, d, prompt, 10)
    assert out.tokens == ids[0, len(prompt):].tolist()


def test_eagle3_clear_errors(drafter, tmp_path, target):
    ids, taps = _ctx(5)
    memory = drafter.new_memory(1)
    with pytest.raises(ValueError, match="empty memory"):
        drafter.draft(memory, ids[:, 0], num_tokens=2, position=torch.tensor([0]))
    with pytest.raises(ValueError, match="taps"):
        drafter.extend_memory(memory, ids, taps[..., 1:])
    with pytest.raises(ValueError, match="num_tokens"):
        drafter.draft(memory, ids[:, 0], num_tokens=6, position=torch.tensor([0]))
    with pytest.raises(ValueError, match="labels"):
        eagle3_loss(drafter, _batch(k=5), steps=7)
    with pytest.raises(ValueError, match="distinct"):
        drafter.set_draft_vocab(torch.zeros(VD, dtype=torch.long))
    with pytest.raises(ValueError, match="not an EAGLE-3"):
        Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "x", architectures=["DFlashDraftModel"]), target)
    weights = specforge_weights()
    del weights["midlayer.hidden_norm.weight"]
    with pytest.raises(ValueError, match="midlayer.hidden_norm.weight"):
        Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "y", weights), target)
    with pytest.raises(ValueError, match="built for another target: hidden_size 64 != the target.s hidden size 32"):
        Eagle3Drafter.from_pretrained(write_specforge(tmp_path / "z"), tiny_qwen3(hidden_size=32, num_layers=6))


@pytest.mark.parametrize("ids, error, message", [
    (torch.tensor([[1, V]]), ValueError, rf"token_ids: expected ids in \[0, {V}\) \(the target's vocabulary\), got \[1, {V}\]"),
    (torch.tensor([[1, -1]]), ValueError, r"token_ids: expected ids in \[0, "),
    (torch.tensor([[1.0, 2.0]]), TypeError, r"token_ids: expected integer token ids \(int64\), got torch.float32"),
    (torch.tensor([1, 2]), ValueError, r"token_ids: expected \[B, T\] int64 token ids, got a tensor of shape \[2\]"),
])
def test_eagle3_extend_memory_refuses_what_are_no_token_ids_naming_them(drafter, ids, error, message):
    """EAGLE-3 embeds the committed tokens: an id outside the vocabulary was a bare IndexError deep in the
    embedding lookup, a float tensor an embedding dtype error."""
    _, taps = _ctx(2)
    memory = drafter.new_memory(1)
    with pytest.raises(error, match=message):
        drafter.extend_memory(memory, ids, taps)
    assert memory.cache.rows == [0] and memory.pending is None  # nothing was written
