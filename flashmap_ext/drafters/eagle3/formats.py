"""EAGLE-3 checkpoint formats other than SpecForge's: vLLM's `speculators` format, read and written.

`speculators` (vllm-project/speculators `Eagle3SpeculatorConfig`): `speculators_model_type: "eagle3"`,
the layer's HF config nested in `transformer_layer_config` (llama, or qwen3 with q/k norms),
`draft_vocab_size`, the flags `norm_before_residual`, `norm_before_fc`, `fc_norm`, `norm_output`,
`target_hidden_size`, and `eagle_aux_hidden_state_layer_ids` in vLLM numbering (the layer whose input is
captured = our id + 1). Weights: `fc`, `layers.0.*` (our `midlayer.*`), `norm`, `lm_head`, `input_norm`
(with `norm_before_fc`), buffers `d2t`, `t2d`; `embed_tokens` and `verifier_*` are the target's.
"""
from __future__ import annotations

from typing import Any

import torch

from flashmap_ext.drafters.common.config import from_engine_layer_ids, rope_theta, to_engine_layer_ids
from flashmap_ext.drafters.eagle3.config import Eagle3Config, eagle3_layer_ids, refuse_layers_and_scaling

SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
_LAYER_TYPES = {"llama": False, "qwen3": True}  # model_type -> q/k norms
_DROPPED = ("embed_tokens.", "verifier_lm_head.", "verifier_norm.")


def is_speculators(cfg: dict[str, Any]) -> bool:
    return "speculators_model_type" in cfg


def config_from_speculators(cfg: dict[str, Any], num_target_layers: int | None) -> Eagle3Config:
    """Eagle3Config of a `speculators` config.json. NotImplementedError, one line naming the field, for
    what we do not run (another speculator type, `fc_norm`, more than one layer, RoPE scaling, ...)."""
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise NotImplementedError(f"speculators_model_type={kind!r} is not supported (only 'eagle3')")
    layer = cfg.get("transformer_layer_config") or {}
    model_type = layer.get("model_type", "llama")
    if model_type not in _LAYER_TYPES:
        raise NotImplementedError(f"transformer_layer_config.model_type={model_type!r} is not supported "
                                  f"(supported: {sorted(_LAYER_TYPES)})")
    if cfg.get("fc_norm"):
        raise NotImplementedError(f"speculators option fc_norm={cfg['fc_norm']!r} (a norm per tap) is not supported")
    refuse_layers_and_scaling(layer, "transformer_layer_config.")
    hidden = int(layer["hidden_size"])
    if cfg.get("target_hidden_size") not in (None, hidden):
        raise NotImplementedError(f"speculators option target_hidden_size={cfg['target_hidden_size']} "
                                  f"!= hidden_size {hidden} is not supported")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        ids = from_engine_layer_ids(ids)
    elif num_target_layers is None:
        raise ValueError("config has no eagle_aux_hidden_state_layer_ids: pass the target to from_pretrained")
    else:
        ids = eagle3_layer_ids(num_target_layers)
    heads = int(layer["num_attention_heads"])
    proposals = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return Eagle3Config(
        hidden_size=hidden, intermediate_size=int(layer["intermediate_size"]), num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads", heads)),
        head_dim=int(layer.get("head_dim") or hidden // heads), vocab_size=int(layer["vocab_size"]),
        draft_vocab_size=int(cfg.get("draft_vocab_size") or layer["vocab_size"]), target_layer_ids=ids,
        num_target_layers=num_target_layers,
        num_draft_tokens=int(proposals[0].get("speculative_tokens", 15)),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta(layer)),
        max_position_embeddings=int(layer.get("max_position_embeddings", 40960)),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        norm_before_fc=bool(cfg.get("norm_before_fc", False)), norm_output=bool(cfg.get("norm_output", False)),
        qk_norm=_LAYER_TYPES[model_type])


def weights_from_speculators(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`speculators` tensor names -> ours (`layers.0.` -> `midlayer.`; the target's tensors dropped)."""
    out = {}
    for name, tensor in weights.items():
        if name.startswith(_DROPPED):
            continue
        if name.startswith("layers.0."):
            name = "midlayer." + name.removeprefix("layers.0.")
        out[name] = tensor.bool() if name == "t2d" else tensor
    return out


def speculators_config(config: Eagle3Config, verifier: str | None = None) -> dict[str, Any]:
    """The `speculators` config.json of `config` (vLLM loads it with `--speculative-config
    '{"model": DIR, "method": "eagle3"}'`); `verifier`: the target's name or path, if known."""
    c = config
    layer = {"model_type": "qwen3" if c.qk_norm else "llama", "hidden_size": c.hidden_size,
             "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
             "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
             "max_position_embeddings": c.max_position_embeddings, "hidden_act": "silu",
             "attention_bias": False, "tie_word_embeddings": False}
    return {"architectures": [SPECULATORS_ARCHITECTURE], "model_type": "speculators",
            "speculators_model_type": "eagle3", "transformer_layer_config": layer,
            "draft_vocab_size": c.draft_vocab_size, "norm_before_residual": c.norm_before_residual,
            "norm_before_fc": c.norm_before_fc, "fc_norm": False, "norm_output": c.norm_output,
            "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": to_engine_layer_ids(c.target_layer_ids),
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": c.num_draft_tokens}],
                                   "verifier": {"name_or_path": verifier, "architectures": []}}}


def weights_to_speculators(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensor names -> `speculators` names (`midlayer.` -> `layers.0.`)."""
    return {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
            for k, v in state.items()}
