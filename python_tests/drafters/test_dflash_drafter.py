"""DFlash drafter: released checkpoint format, cache, training forward, loss (CPU, tiny random targets).

The oracle below is written from the DFlash description (DESIGN.md §11; z-lab `dflash/model.py`), not from the
module: fp64, per-head loops, RoPE as complex rotation, no cache, dense attention over [context | block].
"""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from conftest import tiny_qwen3
from flashmap_ext.drafters.common.base import BlockDrafter
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.dflash.config import build_target_layer_ids
from flashmap_ext.train.dflash import default_gamma, dflash_loss, slot_weights

D, H, G, HD, INTER, LAYERS, BLOCK, MASK = 64, 4, 2, 16, 96, 2, 6, 110
TAPS = [0, 2, 3]


def released_weights(seed=1, n_layers=LAYERS):
    """Every tensor of a released DFlash checkpoint, by its documented name (z-lab's released config and weights)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": (D, len(TAPS) * D), "hidden_norm.weight": (D,), "norm.weight": (D,)}
    for i in range(n_layers):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (H * HD, D), p + "self_attn.k_proj.weight": (G * HD, D),
                   p + "self_attn.v_proj.weight": (G * HD, D), p + "self_attn.o_proj.weight": (D, H * HD),
                   p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
                   p + "mlp.gate_proj.weight": (INTER, D), p + "mlp.up_proj.weight": (INTER, D),
                   p + "mlp.down_proj.weight": (D, INTER), p + "input_layernorm.weight": (D,),
                   p + "post_attention_layernorm.weight": (D,)}
    return {k: (1 + 0.2 * torch.randn(s, generator=g)) if len(s) == 1 else 0.15 * torch.randn(s, generator=g)
            for k, s in shapes.items()}


def released_config(**changes):
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "num_hidden_layers": LAYERS, "hidden_size": D, "intermediate_size": INTER,
           "num_attention_heads": H, "num_key_value_heads": G, "head_dim": HD, "rms_norm_eps": 1e-6,
           "rope_theta": 1000.0, "rope_scaling": None, "max_position_embeddings": 512, "attention_bias": False,
           "tie_word_embeddings": False, "vocab_size": 111, "layer_types": ["full_attention"] * LAYERS,
           "sliding_window": None, "block_size": BLOCK, "num_target_layers": 4, "torch_dtype": "float32",
           "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS}}
    return {**cfg, **changes}


def write_released(path, weights=None, dtype=torch.float32, **changes):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(released_config(**changes)))
    weights = released_weights() if weights is None else weights
    save_file({k: v.to(dtype) for k, v in weights.items()}, str(path / "model.safetensors"))
    return path


# --- independent fp64 oracle ----------------------------------------------------------------------
def _rms(x, w, eps=1e-6):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta=1000.0):
    """x [L, hd] rotated as complex pairs (x_i, x_{i+hd/2}) by angle pos·theta^(−2i/hd)."""
    half = x.shape[-1] // 2
    ang = pos[:, None].double() * theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    z = torch.complex(x[:, :half], x[:, half:]) * torch.polar(torch.ones_like(ang), ang)
    return torch.cat([z.real, z.imag], -1)


def oracle_logits(w, target, taps, anchor, pos):
    """taps [T, n·d] (positions 0…T−1), anchor token at position `pos` -> logits [BLOCK−1, V] fp64."""
    w = {k: v.double() for k, v in w.items()}
    emb, head = target.model.embed_tokens.weight.double(), target.lm_head.weight.double()
    ctx = _rms(taps.double() @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = emb[[anchor] + [MASK] * (BLOCK - 1)]
    ctx_pos, blk_pos = torch.arange(taps.shape[0]), pos + torch.arange(BLOCK)
    for i in range(LAYERS):
        p = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
        h = _rms(x, p("input_layernorm.weight"))
        kv_in, kv_pos = torch.cat([ctx, h]), torch.cat([ctx_pos, blk_pos])
        heads = []
        for j in range(H):
            g = j // (H // G)
            qh, kh = slice(j * HD, (j + 1) * HD), slice(g * HD, (g + 1) * HD)
            q = _rope(_rms((h @ p("self_attn.q_proj.weight").T)[:, qh], p("self_attn.q_norm.weight")), blk_pos)
            k = _rope(_rms((kv_in @ p("self_attn.k_proj.weight").T)[:, kh], p("self_attn.k_norm.weight")), kv_pos)
            v = (kv_in @ p("self_attn.v_proj.weight").T)[:, kh]
            heads.append(torch.softmax(q @ k.T / math.sqrt(HD), -1) @ v)
        x = x + torch.cat(heads, -1) @ p("self_attn.o_proj.weight").T
        h = _rms(x, p("post_attention_layernorm.weight"))
        gated = F.silu(h @ p("mlp.gate_proj.weight").T) * (h @ p("mlp.up_proj.weight").T)
        x = x + gated @ p("mlp.down_proj.weight").T
    return _rms(x, w["norm.weight"])[1:] @ head.T


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(hidden_size=D)


@pytest.fixture
def drafter(tmp_path, target):
    return DFlashDrafter.from_pretrained(write_released(tmp_path / "ckpt"), target)


def _ctx(t, seed=2, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 100, (batch, t), generator=g), torch.randn(batch, t, len(TAPS) * D, generator=g)


# --- checkpoint format ------------------------------------------------------------------------------
def test_dflash_released_checkpoint_matches_oracle(drafter, target):
    assert isinstance(drafter, BlockDrafter)
    assert (drafter.num_draft_tokens, tuple(drafter.target_layer_ids)) == (BLOCK - 1, tuple(TAPS))
    ids, taps = _ctx(9)
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids, taps)
    got = drafter.draft_logits(memory, torch.tensor([7]), torch.tensor([9]))[0]
    want = oracle_logits(released_weights(), target, taps[0], 7, 9)
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-4)
    drafts = drafter.draft(memory, torch.tensor([7]), num_tokens=3, seed=torch.tensor([0]), position=torch.tensor([9]))
    assert drafts.tolist() == [want.argmax(-1)[:3].tolist()]


def test_dflash_save_pretrained_writes_released_format(drafter, tmp_path):
    drafter.save_pretrained(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    ref = released_config()
    for key in ("block_size", "num_target_layers", "hidden_size", "num_hidden_layers", "head_dim", "vocab_size"):
        assert cfg[key] == ref[key], key
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"] == ref["dflash_config"]
    from safetensors.torch import load_file
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert set(saved) == set(released_weights()), "weight names differ from the released format"
    for k, v in released_weights().items():
        torch.testing.assert_close(saved[k], v)


def test_dflash_bf16_checkpoint_keeps_dtype(tmp_path, target):
    d = DFlashDrafter.from_pretrained(write_released(tmp_path / "bf", dtype=torch.bfloat16), target)
    assert d.fc.weight.dtype == torch.bfloat16 and d.layers[1].mlp.up_proj.weight.dtype == torch.bfloat16
    ids, taps = _ctx(5)
    memory = d.new_memory(1)
    d.extend_memory(memory, ids, taps)
    got = d.draft_logits(memory, torch.tensor([3]), torch.tensor([5]))[0].double()
    want = oracle_logits({k: v.bfloat16() for k, v in released_weights().items()}, target, taps[0], 3, 5)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert DFlashDrafter.from_pretrained(tmp_path / "bf", target, dtype=torch.float32).fc.weight.dtype == torch.float32


# --- inference cache --------------------------------------------------------------------------------
def test_dflash_incremental_memory_equals_full_recompute(drafter):
    ids, taps = _ctx(80, batch=2)
    memory, start = drafter.new_memory(2), 0
    for n in (1, 4, 2, 60, 6):  # crosses the initial 64-position capacity
        drafter.extend_memory(memory, ids[:, start:start + n], taps[:, start:start + n])
        start += n
        fresh = drafter.new_memory(2)
        drafter.extend_memory(fresh, ids[:, :start], taps[:, :start])
        anchor, pos = ids[:, start - 1], torch.full((2,), start)
        torch.testing.assert_close(drafter.draft_logits(memory, anchor, pos),
                                   drafter.draft_logits(fresh, anchor, pos), atol=1e-5, rtol=1e-5)
    assert memory.length == 73


def test_dflash_batch_rows_are_independent(drafter):
    ids, taps = _ctx(6, batch=3)
    memory = drafter.new_memory(3)
    drafter.extend_memory(memory, ids, taps)
    anchors, pos = torch.tensor([5, 9, 77]), torch.tensor([6, 6, 6])
    batched = drafter.draft_logits(memory, anchors, pos)
    for r in range(3):
        single = drafter.new_memory(1)
        drafter.extend_memory(single, ids[r:r + 1], taps[r:r + 1])
        torch.testing.assert_close(batched[r:r + 1], drafter.draft_logits(single, anchors[r:r + 1], pos[r:r + 1]),
                                   atol=1e-5, rtol=1e-5)


# --- training forward ---------------------------------------------------------------------------------
def inference_logits(drafter, ids, taps, a: int):
    """The block logits at anchor position `a` the inference path gives: memory of ids[:a] / taps[:a]
    ([T] / [T, taps·d]), then one draft — what a training forward's row for that anchor must equal."""
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids[None, :a], taps[None, :a])
    return drafter.draft_logits(memory, ids[a:a + 1], torch.tensor([a]))[0]


def test_dflash_forward_train_matches_inference(drafter, target):
    ids, taps = _ctx(12, batch=2)
    anchors = torch.tensor([[0, 3, 4, 11], [2, -1, 9, 5]])
    logits = drafter.forward_train(taps, ids, anchors)
    assert logits.shape == (2, 4, BLOCK - 1, 111) and torch.isfinite(logits).all()
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            if a < 0:
                continue
            want = inference_logits(drafter, ids[b], taps[b], a)
            torch.testing.assert_close(logits[b, j], want, atol=1e-5, rtol=1e-5)
            oracle = oracle_logits(released_weights(), target, taps[b, :a], ids[b, a].item(), a)
            torch.testing.assert_close(logits[b, j].double(), oracle, atol=2e-4, rtol=1e-4)


def test_dflash_forward_train_block_ignores_taps_at_or_after_anchor(drafter):
    ids, taps = _ctx(12)
    anchors = torch.tensor([[2, 6, 9]])
    base = drafter.forward_train(taps, ids, anchors)
    later_taps, later_ids = taps.clone(), ids.clone()
    later_taps[:, 6:] += 3 * torch.randn_like(later_taps[:, 6:])
    later_ids[:, 7:] = (later_ids[:, 7:] + 1) % 100
    moved = drafter.forward_train(later_taps, later_ids, anchors)
    torch.testing.assert_close(moved[:, :2], base[:, :2], atol=0, rtol=0)   # anchors 2 and 6: unchanged
    assert (moved[:, 2] - base[:, 2]).abs().max() > 1e-3                    # anchor 9 sees position 6..8
    earlier = taps.clone()
    earlier[:, 5] += 3.0
    assert (drafter.forward_train(earlier, ids, anchors)[:, 1] - base[:, 1]).abs().max() > 1e-3


# --- loss ---------------------------------------------------------------------------------------------
def _batch(drafter, t=16, seed=3, k=None):
    ids, taps = _ctx(t, seed=seed, batch=2)
    anchors = torch.tensor([[0, 4, 9, 13], [1, 2, 10, -1]])
    k = k or BLOCK - 1
    pos = anchors[..., None] + 1 + torch.arange(k)
    following = ids.gather(1, pos.clamp(0, t - 1).flatten(1)).view_as(pos)
    labels = torch.where((pos < t) & (anchors[..., None] >= 0), following, -100)
    return {"input_ids": ids, "taps": taps, "anchor_pos": anchors, "labels": labels}


def test_dflash_loss_matches_hand_computation(drafter):
    assert default_gamma(16) == 7.0 and default_gamma(8) == 4.0
    torch.testing.assert_close(slot_weights(15, 7.0)[[0, 7]], torch.tensor([1.0, math.exp(-1.0)]))
    batch = _batch(drafter, k=BLOCK + 3)
    batch["labels"][0, 1, 2] = -100
    batch["labels"][..., BLOCK - 1:] = 12345  # beyond block_size−1: must be ignored
    loss, metrics = dflash_loss(drafter, batch, gamma=2.5, anchor_chunk=3)
    logp = torch.log_softmax(drafter.forward_train(batch["taps"], batch["input_ids"], batch["anchor_pos"]).double(), -1)
    num = den = 0.0
    for b, a, k in torch.cartesian_prod(torch.arange(2), torch.arange(4), torch.arange(BLOCK - 1)).tolist():
        y = batch["labels"][b, a, k].item()
        if y != -100:
            num += -math.exp(-k / 2.5) * logp[b, a, k, y].item()
            den += math.exp(-k / 2.5)
    assert loss.item() == pytest.approx(num / den, rel=1e-5)
    assert metrics["tokens"] == int((batch["labels"][..., :BLOCK - 1] != -100).sum())


@torch.no_grad()
def test_dflash_reachable_loss_keeps_the_slots_verification_reaches(drafter):
    """reachable: slot k's CE counts only when the drafter's argmax is right at every earlier slot (the
    labels of block a start with its own first a argmaxes, so each block reaches a different depth)."""
    batch = _batch(drafter)
    batch["labels"] = batch["labels"][..., :BLOCK - 1]
    logp = torch.log_softmax(drafter.forward_train(batch["taps"], batch["input_ids"], batch["anchor_pos"]).double(), -1)
    pred = logp.argmax(-1)
    for a in range(4):
        batch["labels"][0, a, :a] = pred[0, a, :a]
    num = den = 0.0
    for b, a, k in torch.cartesian_prod(torch.arange(2), torch.arange(4), torch.arange(BLOCK - 1)).tolist():
        y = batch["labels"][b, a, k].item()
        reached = all(pred[b, a, j].item() == batch["labels"][b, a, j].item() for j in range(k))
        if y != -100 and reached:
            num += -math.exp(-k / 2.5) * logp[b, a, k, y].item()
            den += math.exp(-k / 2.5)
    plain, _ = dflash_loss(drafter, batch, gamma=2.5)
    loss, _ = dflash_loss(drafter, batch, gamma=2.5, reachable=True)
    assert loss.item() == pytest.approx(num / den, rel=1e-5) and abs(loss.item() - plain.item()) > 1e-4
    assert den > 2 * 4 * 1.0 - 1e-9  # past slot 1 somewhere


def test_dflash_loss_decreases_on_tiny_overfit(drafter, target):
    batch = _batch(drafter)
    opt = torch.optim.Adam(drafter.parameters(), lr=5e-3)
    first = None
    for _ in range(20):
        loss, metrics = dflash_loss(drafter, batch)
        assert math.isfinite(loss.item())
        first = first or metrics
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert metrics["loss"] < 0.3 * first["loss"] and metrics["acc"] > first["acc"] + 0.3
    assert target.lm_head.weight.grad is None and target.model.embed_tokens.weight.grad is None


# --- construction and errors ----------------------------------------------------------------------------
def test_dflash_for_target_shapes_and_mask_token(target):
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33] and build_target_layer_ids(36, 1) == [18]

    class Tok:
        def __len__(self):
            return 100
    d = DFlashDrafter.for_target(target, tokenizer=Tok(), num_hidden_layers=1, block_size=4)
    c = d.config
    got = (c.mask_token_id, c.hidden_size, c.num_key_value_heads, c.vocab_size, c.num_target_layers)
    assert got == (100, D, 2, 111, 4)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashDrafter.for_target(target)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashDrafter.for_target(target, mask_token_id=111)


def test_dflash_clear_errors(drafter, tmp_path, target):
    ids, taps = _ctx(5)
    memory = drafter.new_memory(1)
    with pytest.raises(ValueError, match="taps"):
        drafter.extend_memory(memory, ids, taps[..., :-1])
    with pytest.raises(ValueError, match="num_tokens"):
        drafter.draft(memory, ids[:, 0], num_tokens=BLOCK, position=torch.tensor([0]))
    with pytest.raises(ValueError, match="anchor_pos"):
        drafter.forward_train(taps, ids, torch.tensor([[5]]))
    batch = _batch(drafter, k=BLOCK - 2)
    with pytest.raises(ValueError, match="block_size"):
        dflash_loss(drafter, batch)
    with pytest.raises(RuntimeError, match="attach_target"):
        DFlashDrafter(drafter.config).draft(memory, ids[:, 0], num_tokens=1, position=torch.tensor([5]))
    weights = released_weights()
    del weights["layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="layers.1.mlp.up_proj.weight"):
        DFlashDrafter.from_pretrained(write_released(tmp_path / "missing", weights), target)
    with pytest.raises(ValueError, match="not a DFlash"):
        DFlashDrafter.from_pretrained(write_released(tmp_path / "arch", architectures=["Qwen3ForCausalLM"]), target)
    with pytest.raises(NotImplementedError, match="rope_scaling.rope_type"):
        DFlashDrafter.from_pretrained(write_released(tmp_path / "dyn", rope_scaling={"type": "dynamic", "factor": 2}),
                                      target)
    with pytest.raises(ValueError, match="hidden"):
        DFlashDrafter.from_pretrained(write_released(tmp_path / "ok"), tiny_qwen3(hidden_size=32))


# --- draft vocabulary -------------------------------------------------------------------------------
def test_dflash_draft_vocab_restricts_drafts_loss_and_roundtrips(tmp_path, target):
    full = DFlashDrafter.from_pretrained(write_released(tmp_path / "ckpt"), target)
    rows = torch.tensor([3, 7, 12, 40, 41, 99])
    small = DFlashDrafter(dataclasses.replace(full.config, draft_vocab_size=len(rows)), target)
    small.load_state_dict(full.state_dict(), strict=False)
    small.set_draft_vocab(rows[torch.randperm(len(rows))])
    ids, taps = _ctx(9)
    memory = small.new_memory(1)
    small.extend_memory(memory, ids, taps)
    args = (torch.tensor([7]), torch.tensor([9]))
    want = full.draft_logits(_filled(full, ids, taps), *args)[0][:, rows]
    got = small.draft_logits(memory, *args)[0]
    assert torch.isinf(got[:, [0, 1, 2]]).all()
    torch.testing.assert_close(got[:, rows], want)
    drafts = small.draft(memory, args[0], num_tokens=4, seed=torch.tensor([0]), position=args[1])
    assert drafts.tolist() == [rows[want.argmax(-1)[:4]].tolist()]
    batch = _batch(small)
    loss, metrics = dflash_loss(small, batch)
    assert math.isfinite(loss.item()) and metrics["tokens"] <= int((batch["labels"][..., :BLOCK - 1] >= 0).sum())
    small.save_pretrained(tmp_path / "small")
    back = DFlashDrafter.from_pretrained(tmp_path / "small", target)
    assert back.config.draft_vocab_size == len(rows) and back.vocab.target_ids.tolist() == rows.tolist()


def _filled(drafter, ids, taps):
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids, taps)
    return memory
