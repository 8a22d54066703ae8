"""EAGLE-3 in vLLM's `speculators` format and the engine exports (SpecForge with a stored head).

The oracle extends test_eagle3_drafter's fp64 chain with the `speculators` options, written from their
description (vllm-project/speculators `Eagle3FirstLayerMixin`, SGLang `Eagle3LlamaModel`):
norm_before_fc = RMSNorm over the concatenated taps before fc; norm_before_residual = the layer's residual
is hidden_norm(g); norm_output = the next step's hidden is norm(o); a qwen3 layer adds per-head q/k RMSNorm
before RoPE. Tap ids in the file are vLLM's (ours + 1).
"""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from test_eagle3_drafter import (
    DRAFT_IDS,
    HD,
    INTER,
    TAPS,
    VD,
    D,
    G,
    H,
    V,
    _ctx,
    _rms,
    _rope,
    assert_chain_like_oracle,
    specforge_weights,
    write_specforge,
)

from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.eagle3.config import Eagle3Config

FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output")


def speculators_weights(qk_norm=True, input_norm=True, seed=4):
    w = {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
         for k, v in specforge_weights(seed).items()}
    g = torch.Generator().manual_seed(seed + 1)
    if input_norm:
        w["input_norm.weight"] = 1 + 0.3 * torch.randn(len(TAPS) * D, generator=g)
    if qk_norm:
        w["layers.0.self_attn.q_norm.weight"] = 1 + 0.3 * torch.randn(HD, generator=g)
        w["layers.0.self_attn.k_norm.weight"] = 1 + 0.3 * torch.randn(HD, generator=g)
    return w


def speculators_config(model_type="qwen3", **changes):
    layer = {"model_type": model_type, "hidden_size": D, "intermediate_size": INTER, "num_attention_heads": H,
             "num_key_value_heads": G, "head_dim": HD, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
             "rope_theta": 1000.0, "max_position_embeddings": 512, "vocab_size": V}
    return {"architectures": ["Eagle3Speculator"], "model_type": "speculators", "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": VD, "norm_before_residual": True,
            "norm_before_fc": True, "fc_norm": False, "norm_output": True, "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in TAPS], "torch_dtype": "float32",
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy",
                                                                                "speculative_tokens": 4}]},
            **changes}


def write_speculators(path, weights=None, **changes):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(speculators_config(**changes)))
    weights = speculators_weights() if weights is None else weights
    save_file({**weights, "embed_tokens.weight": torch.randn(V, D)}, str(path / "model.safetensors"))
    return path


def _last_output(w, emb, hid, pos, flags):
    """The layer over pairs (hid [L, d], emb [L, d]) at positions [L]: the last pair's output o."""
    p = lambda n: w["layers.0." + n]  # noqa: E731
    normed = _rms(hid, p("hidden_norm.weight"))
    x = torch.cat([_rms(emb, p("input_layernorm.weight")), normed], -1)
    heads = []
    for j in range(H):
        qh, kh = slice(j * HD, (j + 1) * HD), slice((j // (H // G)) * HD, (j // (H // G) + 1) * HD)
        q, k = (x[-1:] @ p("self_attn.q_proj.weight").T)[:, qh], (x @ p("self_attn.k_proj.weight").T)[:, kh]
        if flags["qk_norm"]:
            q, k = _rms(q, p("self_attn.q_norm.weight")), _rms(k, p("self_attn.k_norm.weight"))
        q, k = _rope(q, pos[-1:]), _rope(k, pos)
        heads.append(torch.softmax(q @ k.T / math.sqrt(HD), -1) @ (x @ p("self_attn.v_proj.weight").T)[:, kh])
    residual = normed[-1:] if flags["norm_before_residual"] else hid[-1:]
    h = residual + torch.cat(heads, -1) @ p("self_attn.o_proj.weight").T
    m = _rms(h, p("post_attention_layernorm.weight"))
    return h + (F.silu(m @ p("mlp.gate_proj.weight").T) * (m @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T


def oracle_chain(w, target, ids, taps, steps, flags):
    """Greedy chain after context ids [n] (anchor ids[-1]) with taps [n−1, n·d] -> (logits, target ids)."""
    w = {k: v.double() for k, v in w.items()}
    emb_table = target.model.embed_tokens.weight.double()
    x = _rms(taps.double(), w["input_norm.weight"]) if flags["norm_before_fc"] else taps.double()
    hid, tok = list(x @ w["fc.weight"].T), list(ids[1:].tolist())
    logits, drafts = [], []
    for _ in range(steps):
        out = _last_output(w, emb_table[tok], torch.stack(hid), torch.arange(len(tok)), flags)[0]
        normed = _rms(out, w["norm.weight"])
        logits.append(normed @ w["lm_head.weight"].T)
        drafts.append(DRAFT_IDS[logits[-1].argmax()].item())
        hid, tok = hid + [normed if flags["norm_output"] else out], tok + [drafts[-1]]
    return torch.stack(logits), drafts


@pytest.fixture(scope="module")
def target():
    from conftest import tiny_qwen3
    return tiny_qwen3(hidden_size=D, num_layers=6)


@pytest.mark.parametrize("on", [(), ("qk_norm",), FLAGS, FLAGS + ("qk_norm",)], ids=str)
def test_speculators_checkpoint_drafts_like_the_oracle(on, target, tmp_path):
    flags = {f: f in on for f in FLAGS + ("qk_norm",)}
    w = speculators_weights(flags["qk_norm"], flags["norm_before_fc"])
    path = write_speculators(tmp_path / "spec", weights=w,
                             model_type="qwen3" if flags["qk_norm"] else "llama",
                             **{f: flags[f] for f in FLAGS})
    drafter = Eagle3Drafter.from_pretrained(path, target)
    assert tuple(drafter.target_layer_ids) == tuple(TAPS) and drafter.num_draft_tokens == 4
    ids, taps = _ctx(9)
    assert_chain_like_oracle(drafter, oracle_chain(w, target, ids[0], taps[0, :8], 4, flags), ids, taps, 8)


def test_each_flag_changes_the_drafts(target):
    """The options are not vacuous on these weights: switching any one changes the oracle's logits."""
    ids, taps = _ctx(9)
    w = speculators_weights(True)
    base = {f: True for f in FLAGS + ("qk_norm",)}
    ref = oracle_chain(w, target, ids[0], taps[0, :8], 3, base)[0]
    for f in base:
        assert (oracle_chain(w, target, ids[0], taps[0, :8], 3, {**base, f: False})[0] - ref).abs().max() > 1e-3, f


def test_speculators_save_roundtrip(target, tmp_path):
    drafter = Eagle3Drafter.from_pretrained(write_speculators(tmp_path / "spec"), target)
    drafter.save_pretrained(tmp_path / "out", format="speculators", verifier="Qwen/Qwen3-8B")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]
    assert all(cfg[f] for f in FLAGS) and cfg["transformer_layer_config"]["model_type"] == "qwen3"
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert set(saved) == set(speculators_weights()), "tensor names differ from speculators'"
    assert all(torch.equal(saved[k], v) for k, v in speculators_weights().items()), "weights are copied as they are"
    again = Eagle3Drafter.from_pretrained(tmp_path / "out", target)
    ids, taps = _ctx(7)
    want = oracle_chain(speculators_weights(), target, ids[0], taps[0, :6], 4, dict.fromkeys(FLAGS + ("qk_norm",), True))
    for d in (drafter, again):
        assert_chain_like_oracle(d, want, ids, taps, 6)


def test_engine_export_stores_the_frozen_head(target, tmp_path):
    """A frozen-head drafter omits lm_head.weight in our format; `format="specforge"` stores the target's
    rows (what SpecForge's exporter and the engines expect) and loads without the target."""
    draft = torch.tensor([5, 1, 90, 33, 7, 64])
    d = Eagle3Drafter.for_target(target, draft_ids=draft, dtype=torch.float32, intermediate_size=16,
                                 target_layer_ids=TAPS, frozen_lm_head=True)
    d.save_pretrained(tmp_path / "ours")
    assert "lm_head.weight" not in load_file(tmp_path / "ours" / "model.safetensors")
    d.save_pretrained(tmp_path / "engine", format="specforge")
    saved = load_file(tmp_path / "engine" / "model.safetensors")
    assert torch.equal(saved["lm_head.weight"], target.lm_head.weight.detach()[draft])
    cfg = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert not cfg["frozen_lm_head"] and cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in TAPS]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TAPS
    again = Eagle3Drafter.from_pretrained(tmp_path / "engine")
    assert torch.equal(again.lm_head.weight, d.lm_head.weight)
    with pytest.raises(ValueError, match="format"):
        d.save_pretrained(tmp_path / "bad", format="onnx")


def test_top_level_engine_ids_are_read_minus_one(tmp_path, target):
    """A file with only vLLM's top-level ids (ours + 1) taps the same layers."""
    path = write_specforge(tmp_path / "top", eagle_config={}, eagle_aux_hidden_state_layer_ids=[2, 4, 6])
    assert tuple(Eagle3Drafter.from_pretrained(path, target).target_layer_ids) == (1, 3, 5)
    cfg = Eagle3Config.from_hf_dict({**json.loads((path / "config.json").read_text()),
                                     "eagle_config": {"eagle_aux_hidden_state_layer_ids": TAPS}}, 6)
    assert cfg.target_layer_ids == tuple(TAPS)  # eagle_config (SGLang numbering) wins


REFUSED = {
    "fc_norm": ({"fc_norm": True}, "fc_norm"),
    "dflash": ({"speculators_model_type": "dflash"}, "speculators_model_type"),
    "gpt-oss": ({"model_type": "gpt_oss"}, "transformer_layer_config.model_type"),
    "target-hidden": ({"target_hidden_size": 2 * D}, "target_hidden_size"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_speculators_options_are_refused_in_one_line(name, target, tmp_path):
    changes, field = REFUSED[name]
    with pytest.raises(NotImplementedError) as err:
        Eagle3Drafter.from_pretrained(write_speculators(tmp_path / name, **changes), target)
    assert field in str(err.value) and "\n" not in str(err.value)
