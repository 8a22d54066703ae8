"""EAGLE-3 drafter configuration and its checkpoint `config.json` format.

Format: SpecForge / SGLang `LlamaForCausalLMEagle3` (SpecForge `configs/qwen3-4b-eagle3.json`): Llama
fields with `num_hidden_layers: 1`, `draft_vocab_size`, and the tapped layers in
`eagle_config.eagle_aux_hidden_state_layer_ids` (0-based decoder-layer outputs, as our
`target_layer_ids`; SGLang reads these). vLLM reads a top-level `eagle_aux_hidden_state_layer_ids` that
numbers the layer whose *input* is captured (ours + 1); we write both and read either. We add
`num_target_layers` and `num_draft_tokens` (ignored by other readers). The `speculators` format (vLLM's)
is read and written by `eagle3/formats.py`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flashmap_ext.drafters.common.config import (
    TargetShaped,
    check_field_types,
    from_engine_layer_ids,
    rope_scaling,
    rope_theta,
    to_engine_layer_ids,
)

ARCHITECTURE = "LlamaForCausalLMEagle3"


def eagle3_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high taps: outputs of layers 1, L//2−1 and L−4 (= inputs of layers 2, L//2, L−3,
    SafeAILab/EAGLE `modeling_llama_kv.py`; 36 layers -> [1, 17, 32]). Clamped to [0, L) and
    de-duplicated for very shallow targets."""
    n = num_target_layers
    return sorted({min(max(i, 0), n - 1) for i in (1, n // 2 - 1, n - 4)})


def refuse_layers_and_scaling(layer: dict[str, Any], prefix: str) -> None:
    """NotImplementedError naming the field for more than one layer or a scaled RoPE (`prefix`: where the
    fields sit in the file, e.g. "transformer_layer_config.")."""
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise NotImplementedError(f"{prefix}num_hidden_layers={layer['num_hidden_layers']}: only single-layer "
                                  f"EAGLE-3 drafters are supported")
    if rope_scaling(layer) is not None:
        raise NotImplementedError(f"{prefix or 'EAGLE-3 option '}rope_scaling={rope_scaling(layer)} is not supported")


@dataclass
class Eagle3Config(TargetShaped):
    """Shapes of an EAGLE-3 drafter. `hidden_size` equals the target's (its embeddings feed the layer);
    `vocab_size` = target embedding rows; `draft_vocab_size` = rows of the drafter's own LM head (32k for
    Qwen3 in EAGLE-3; = vocab_size for no subset). `num_draft_tokens` = chain length per round.
    `frozen_lm_head`: our option, not EAGLE-3's (which trains its head): the head is the target's LM-head
    rows of the draft vocabulary, frozen and not stored, attached at load as FlashMap and DFlash do here
    (same head and trainable-parameter budget for a fair comparison; smaller checkpoints)."""
    draft_vocab_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None  # None: not in the file (the ids are); attach_target checks them
    num_draft_tokens: int = 15
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    initializer_range: float = 0.02
    frozen_lm_head: bool = False  # True: LM head = the target's rows of the draft vocabulary, frozen, not stored
    # `speculators` options (vLLM), all off in SpecForge / SafeAILab checkpoints:
    norm_before_residual: bool = False  # the layer's residual is hidden_norm(g) instead of g
    norm_before_fc: bool = False  # an RMSNorm (`input_norm`, n_taps·d wide) on the concatenated taps before fc
    norm_output: bool = False  # the hidden state carried to the next drafting step is norm(o) instead of o
    qk_norm: bool = False  # Qwen3-style per-head q/k RMSNorm in the layer (a qwen3 transformer_layer_config)

    def __post_init__(self):
        self.check_shapes()
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        ids = list(d.pop("target_layer_ids"))
        for name in ("norm_before_residual", "norm_before_fc", "norm_output", "qk_norm"):
            if not d[name]:
                del d[name]  # SpecForge / SafeAILab files stay as they were
        if d["num_target_layers"] is None:
            del d["num_target_layers"]
        return {"architectures": [ARCHITECTURE], "model_type": "llama", **d, "num_hidden_layers": 1,
                "hidden_act": "silu", "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
                "eagle_aux_hidden_state_layer_ids": to_engine_layer_ids(ids)}

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], num_target_layers: int | None = None) -> "Eagle3Config":
        """Parses an EAGLE-3 `config.json`. Tap ids default to `eagle3_layer_ids` of the target depth
        (`num_target_layers` from the file, else the argument); ValueError when neither is known or the
        file is not EAGLE-3; NotImplementedError for RoPE scaling or more than one layer."""
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise ValueError(f"not an EAGLE-3 checkpoint: architectures={cfg.get('architectures')}")
        check_field_types(cfg, _SCHEMA)
        check_field_types(cfg.get("eagle_config") or {}, {"eagle_aux_hidden_state_layer_ids": "ints?"}, "eagle_config.")
        refuse_layers_and_scaling(cfg, "")
        n_target = cfg.get("num_target_layers", num_target_layers)
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if not ids and cfg.get("eagle_aux_hidden_state_layer_ids"):  # vLLM numbering: ours + 1
            ids = from_engine_layer_ids(cfg["eagle_aux_hidden_state_layer_ids"])
        if not ids and n_target is None:
            raise ValueError("config has no tap ids and no num_target_layers: pass the target to from_pretrained")
        ids = ids or eagle3_layer_ids(n_target)
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        return cls(hidden_size=hidden, intermediate_size=int(cfg["intermediate_size"]), num_attention_heads=heads,
                   num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                   head_dim=int(cfg.get("head_dim") or hidden // heads), vocab_size=int(cfg["vocab_size"]),
                   draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]), target_layer_ids=ids,
                   num_target_layers=None if n_target is None else int(n_target),
                   num_draft_tokens=int(cfg.get("num_draft_tokens", 15)),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta(cfg)),
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
                   initializer_range=float(cfg.get("initializer_range", 0.02)),
                   frozen_lm_head=bool(cfg.get("frozen_lm_head", False)),
                   **{k: bool(cfg.get(k, False)) for k in ("norm_before_residual", "norm_before_fc",
                                                            "norm_output", "qk_norm")})


# JSON types of the fields `from_hf_dict` reads (common.config.check_field_types; "?": null allowed).
_SCHEMA = {"num_hidden_layers": "int", "hidden_size": "int", "intermediate_size": "int", "num_attention_heads": "int", "num_key_value_heads": "int",
           "head_dim": "int?", "vocab_size": "int", "draft_vocab_size": "int?", "num_target_layers": "int?",
           "num_draft_tokens": "int", "rms_norm_eps": "float", "rope_theta": "float", "max_position_embeddings": "int",
           "initializer_range": "float", "frozen_lm_head": "bool", "eagle_aux_hidden_state_layer_ids": "ints?",
           **{k: "bool" for k in ("norm_before_residual", "norm_before_fc", "norm_output", "qk_norm")}}
