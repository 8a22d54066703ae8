"""DFlash2 in `speculators`' layout (vllm-project/speculators 0.9, `speculators/models/dflash2/`).

config.json: `speculators_model_type: "dflash2"`, the drafter's Qwen3 settings nested under
`transformer_layer_config` (its `num_hidden_layers` = the drafter's layers), and at the top level
`block_size`, `mask_token_id`, `aux_hidden_state_layer_ids`, `draft_vocab_size`, `conv_*`, `selector_*`,
`sliding_window_non_causal`, `sample_from_anchor`, `target_hidden_size`, `speculators_config`. The weights
carry the same names as z-lab's (no embedding, no LM head: the target's).

Semantics (the reference's training forward): tap ids index HF `hidden_states` (ours are one less); full
layers attend bidirectionally inside the block; sliding layers read the context [anchor − W, anchor)
(`window_from_anchor`) and attend inside the block bidirectionally when `sliding_window_non_causal`
(its default for DFlash2), else causally.
"""
from __future__ import annotations

from typing import Any

from flashmap_ext.drafters.common.config import from_engine_layer_ids, rope_theta, to_engine_layer_ids
from flashmap_ext.drafters.dflash.config import SLIDING
from flashmap_ext.drafters.dflash2.config import ARCHITECTURE, DEFAULTS, DFlash2Config

MODEL_TYPE = "dflash2"
VERSION = "0.9.0"


def is_speculators(cfg: dict[str, Any]) -> bool:
    return cfg.get("speculators_model_type") is not None


def from_speculators(cfg: dict[str, Any]) -> DFlash2Config:
    """DFlash2Config of a speculators `config.json`. ValueError for another speculators type or a missing
    field; NotImplementedError naming the field for what the reference cannot run either or we do not."""
    if cfg.get("speculators_model_type") != MODEL_TYPE:
        raise ValueError(f"speculators_model_type={cfg.get('speculators_model_type')!r} is not a DFlash2 drafter")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError("missing field transformer_layer_config (the drafter's Qwen3 settings)")
    if cfg.get("sample_from_anchor"):
        raise NotImplementedError("DFlash2 option sample_from_anchor=True is not supported (the anchor is the "
                                  "verified token; drafts start at the slot after it)")
    vocab = layer.get("vocab_size")
    if cfg.get("draft_vocab_size") not in (None, vocab):
        raise NotImplementedError(f"DFlash2 option draft_vocab_size={cfg['draft_vocab_size']} != vocab_size "
                                  f"{vocab} is not supported (speculators' DFlash2 drafts from the full vocabulary)")
    for name in ("mask_token_id", "aux_hidden_state_layer_ids"):
        if cfg.get(name) is None:
            raise ValueError(f"missing field {name}")
    sliding = SLIDING in (layer.get("layer_types") or [])
    non_causal = cfg.get("sliding_window_non_causal", True)
    draft = {"block_size": cfg.get("block_size", 8), "mask_token_id": cfg["mask_token_id"],
             "target_layer_ids": from_engine_layer_ids(cfg["aux_hidden_state_layer_ids"]),
             **{name: cfg.get(name, default) for name, default in DEFAULTS.items()},
             "window_from_anchor": sliding}
    zlab = {**layer, "architectures": [ARCHITECTURE], "target_hidden_size": cfg.get("target_hidden_size"),
            "dflash_config": draft}
    zlab.pop("is_causal", None)
    if sliding and non_causal:
        zlab["is_causal"] = False  # full layers are bidirectional either way
    return DFlash2Config.from_hf_dict(zlab)


def to_speculators(config: DFlash2Config, dtype: str, verifier: str | None = None) -> dict[str, Any]:
    """The speculators `config.json` of `config`; NotImplementedError naming the field speculators'
    DFlash2 has no place for (a draft vocabulary, our context window, Gemma-style scales, causal full
    layers, z-lab's per-query sliding window)."""
    c = config
    neutral = {"draft_vocab_size": None, "context_window": None, "input_embedding_scale": 1.0,
               "output_multiplier": 1.0, "final_logit_softcapping": None}
    for name, value in neutral.items():
        if getattr(c, name) != value:
            raise NotImplementedError(f"{name}={getattr(c, name)!r} has no place in speculators' DFlash2 format")
    sliding = c.layer_types is not None and SLIDING in c.layer_types
    if c.is_causal:
        raise NotImplementedError("is_causal=True has no place in speculators' DFlash2 format (its full layers "
                                  "attend bidirectionally inside the block)")
    if sliding and not c.window_from_anchor:
        raise NotImplementedError("window_from_anchor=False (z-lab's per-query sliding window) has no place in "
                                  "speculators' DFlash2 format")
    hf = c.to_hf_dict()
    layer = {k: v for k, v in hf.items() if k not in ("architectures", "dflash_config",
                                                       "rope_theta", "rope_scaling", "draft_vocab_size",
                                                       "is_causal", "block_size")}
    layer["rope_parameters"] = {"rope_theta": float(rope_theta(hf)), **(c.rope_scaling or {"rope_type": "default"})}
    return {"speculators_model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "speculators_version": VERSION,
            "transformer_layer_config": layer, "draft_vocab_size": c.vocab_size, "block_size": c.block_size,
            "target_hidden_size": None, "aux_hidden_state_layer_ids": to_engine_layer_ids(c.target_layer_ids),
            "mask_token_id": c.mask_token_id, "sliding_window_non_causal": not sliding or c.is_causal is False,
            "sample_from_anchor": False, **{name: getattr(c, name) for name in DEFAULTS},
            "dtype": dtype, "tie_word_embeddings": False,
            "speculators_config": {"algorithm": MODEL_TYPE, "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "accept_tolerance": 0.0,
                                                         "speculative_tokens": c.block_size - 1,
                                                         "verifier_accept_k": 1}],
                                   "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]}}}


def parse(cfg: dict[str, Any]) -> DFlash2Config:
    """A DFlash2 config.json in either layout."""
    return from_speculators(cfg) if is_speculators(cfg) else DFlash2Config.from_hf_dict(cfg)
