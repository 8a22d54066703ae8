"""DFlash drafter configuration and its released `config.json` format.

Format (z-lab `Qwen3-8B-DFlash-b16`, mirrored in SpecForge `configs/qwen3-8b-dflash.json`;
DESIGN.md §11): HF Qwen3 fields plus `architectures: ["DFlashDraftModel"]`, `block_size`,
`num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`. Newer z-lab releases add
`layer_types` + `sliding_window` (sliding-window layers, causal unless `is_causal` says otherwise),
`is_causal` (vLLM also reads `dflash_config.causal`), RoPE scaling, and `dflash_config.{input_embedding_scale,
output_multiplier, final_logit_softcapping}` (Gemma-style targets). Semantics follow z-lab's `dflash==0.1.0`
(`dflash/model.py`), which the differential tests run side by side with this implementation. Ours:
`dflash_config.context_window` (the drafter context window, common/window.py), written only when set;
other readers ignore it, so the vLLM exporter refuses it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from flashmap_ext.drafters.common.config import (
    TargetShaped,
    check_field_types,
    from_engine_layer_ids,
    rope_scaling,
    rope_theta,
)
from flashmap_ext.drafters.common.layers import SEQUENCE_DEPENDENT_ROPE
from flashmap_ext.drafters.common.window import check_window

ARCHITECTURE = "DFlashDraftModel"
FULL, SLIDING = "full_attention", "sliding_attention"


def build_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """DFlash's default taps: `num_taps` ids spread evenly (rounded) from layer 1 to L−3, or [L // 2] for
    one tap (z-lab `build_target_layer_ids`). 36 layers, 5 taps -> [1, 9, 17, 25, 33]. Duplicates that
    appear for very shallow targets are dropped."""
    if num_taps < 1:
        raise ValueError(f"num_taps must be >= 1, got {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    ids = [int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps)]
    return sorted(set(min(i, num_target_layers - 1) for i in ids))


@dataclass
class DFlashConfig(TargetShaped):
    """Shapes of a DFlash drafter. `hidden_size` must equal the target's (the drafter reads the target's
    embeddings and feeds its LM head); `vocab_size` is the target's embedding rows (padding included)."""
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None  # None: unknown until a target is attached (the file lists the ids)
    num_hidden_layers: int = 5
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    initializer_range: float = 0.02
    draft_vocab_size: int | None = None  # drafts from these LM-head rows only (buffer d2t); None: all rows
    layer_types: tuple[str, ...] | None = None  # per layer FULL | SLIDING; None: all FULL
    sliding_window: int | None = None  # window of SLIDING layers: keys at distance < window; None: no window
    is_causal: bool | None = None  # every layer causal (True) or bidirectional (False); None: SLIDING layers causal
    rope_scaling: dict | None = None  # HF rope parameters without rope_theta (rope_type, factor, ...); None: default
    input_embedding_scale: float = 1.0  # block embeddings are multiplied by it
    output_multiplier: float = 1.0  # draft logits are multiplied by it ...
    final_logit_softcapping: float | None = None  # ... then softcapped: c·tanh(logits / c) when c > 0
    context_window: int | None = None  # ours: read the last W memory entries only (common/window.py); None: all

    architecture: ClassVar[str] = ARCHITECTURE
    draft_fields: ClassVar[tuple[str, ...]] = ()  # a subclass's fields written into `dflash_config`

    def __post_init__(self):
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {self.block_size}")
        self.check_shapes()
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the embedding table [0, {self.vocab_size})")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]")
        if self.layer_types is not None:
            self.layer_types = tuple(self.layer_types)
            if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
                raise ValueError(f"layer_types must list {self.num_hidden_layers} of {FULL!r}/{SLIDING!r}, "
                                 f"got {list(self.layer_types)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        check_window(self.context_window)

    def layer_attention(self, i: int) -> tuple[bool, int | None]:
        """(causal, window) of layer i, z-lab's rule: `is_causal` if set, else causal iff the layer is
        SLIDING; window = `sliding_window` for SLIDING layers, None for FULL ones."""
        sliding = self.layer_types is not None and self.layer_types[i] == SLIDING
        causal = sliding if self.is_causal is None else bool(self.is_causal)
        return causal, (self.sliding_window if sliding else None)

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - 1

    def to_hf_dict(self) -> dict[str, Any]:
        """The released `config.json` content (without `torch_dtype`, which the saver adds). Options at
        their neutral value are written as the v1 release does (full attention, no scaling)."""
        d = dataclasses.asdict(self)
        extra = {k: d.pop(k) for k in ("mask_token_id", "target_layer_ids", *self.draft_fields)}
        extra["target_layer_ids"] = list(extra["target_layer_ids"])
        for name, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                              ("final_logit_softcapping", None), ("context_window", None)):
            value = d.pop(name)
            if value != neutral:
                extra[name] = value
        for name in ("layer_types", "sliding_window", "is_causal", "rope_scaling"):
            d.pop(name)
        if d["num_target_layers"] is None:
            del d["num_target_layers"]
        out = {"architectures": [self.architecture], "model_type": "qwen3", **d, "hidden_act": "silu",
               "rope_scaling": self.rope_scaling, "attention_dropout": 0.0, "tie_word_embeddings": False,
               "layer_types": list(self.layer_types or [FULL] * self.num_hidden_layers),
               "sliding_window": self.sliding_window, "use_sliding_window": self.sliding_window is not None,
               "dflash_config": extra}
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        return out

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "DFlashConfig":
        """Parses a released DFlash `config.json`. ValueError for a non-DFlash or incomplete config;
        NotImplementedError, one line naming the field, for what this implementation does not run
        (DFlash2 heads, dynamic/longrope RoPE, vLLM's `use_swa`/attention sinks, ...)."""
        if cls.architecture not in (cfg.get("architectures") or []):
            if "DFlash2DraftModel" in (cfg.get("architectures") or []):
                raise NotImplementedError("DFlash2 (architectures=['DFlash2DraftModel']: conv layers + candidate "
                                          "selector) is not a DFlash checkpoint: load it as DFlash2")
            raise ValueError(f"not a {cls.architecture} checkpoint: architectures={cfg.get('architectures')}")
        return cls(**cls.hf_fields(cfg))

    @classmethod
    def hf_fields(cls, cfg: dict[str, Any], allowed: frozenset = frozenset()) -> dict[str, Any]:
        """The DFlashConfig fields of a released `config.json` (what `from_hf_dict` builds from); `allowed`:
        fields of `_UNSUPPORTED` a subclass runs (DFlash2's `conv_kernel_size`, `selector_rank`)."""
        draft = cfg.get("dflash_config") or {}
        check_field_types(cfg, _TOP_SCHEMA)
        check_field_types(draft, _DRAFT_SCHEMA, "dflash_config.")
        reject_unsupported(cfg, allowed)

        def field(name, default=None):
            return draft.get(name, cfg.get(name, default))
        if field("mask_token_id") is None:
            raise ValueError("config has no dflash_config.mask_token_id")
        if field("block_size") is None:  # z-lab's reference has no default either
            raise ValueError("missing field block_size (the draft block length, anchor included)")
        n_layers = int(cfg["num_hidden_layers"])
        num_target_layers = cfg.get("num_target_layers")
        ids = field("target_layer_ids")
        if ids is None and cfg.get("eagle_aux_hidden_state_layer_ids"):
            ids = from_engine_layer_ids(cfg["eagle_aux_hidden_state_layer_ids"])
        if ids is None:
            if num_target_layers is None:
                raise ValueError("config has neither dflash_config.target_layer_ids nor num_target_layers")
            ids = build_target_layer_ids(int(num_target_layers), n_layers)
        heads = int(cfg["num_attention_heads"])
        causal = cfg.get("is_causal", draft.get("causal"))
        softcap = field("final_logit_softcapping")
        return dict(hidden_size=int(cfg["hidden_size"]), intermediate_size=int(cfg["intermediate_size"]),
                    num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                    head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                    vocab_size=int(cfg["vocab_size"]), mask_token_id=int(field("mask_token_id")),
                    target_layer_ids=ids, num_hidden_layers=n_layers,
                    num_target_layers=None if num_target_layers is None else int(num_target_layers),
                    block_size=int(field("block_size")), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                    rope_theta=float(rope_theta(cfg)),
                    max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
                    attention_bias=bool(cfg.get("attention_bias", False)),
                    initializer_range=float(cfg.get("initializer_range", 0.02)),
                    draft_vocab_size=None if cfg.get("draft_vocab_size") is None else int(cfg["draft_vocab_size"]),
                    layer_types=cfg.get("layer_types"),
                    sliding_window=_sliding_window(cfg),
                    is_causal=None if causal is None else bool(causal), rope_scaling=rope_scaling(cfg),
                    input_embedding_scale=float(field("input_embedding_scale", 1.0)),
                    output_multiplier=float(field("output_multiplier", 1.0)),
                    final_logit_softcapping=None if softcap is None else float(softcap),
                    context_window=draft.get("context_window"))


# JSON types of the fields `from_hf_dict` reads (common.config.check_field_types; "?": null allowed).
_SHARED = {"block_size": "int", "mask_token_id": "int", "target_layer_ids": "ints",
           "input_embedding_scale": "float", "output_multiplier": "float", "final_logit_softcapping": "float?"}
_TOP_SCHEMA = {**_SHARED, "hidden_size": "int", "intermediate_size": "int", "num_attention_heads": "int",
               "num_key_value_heads": "int", "head_dim": "int?", "vocab_size": "int", "num_hidden_layers": "int",
               "num_target_layers": "int?", "rms_norm_eps": "float", "rope_theta": "float",
               "max_position_embeddings": "int", "attention_bias": "bool", "initializer_range": "float",
               "draft_vocab_size": "int?", "sliding_window": "int?", "use_sliding_window": "bool?",
               "is_causal": "bool?", "eagle_aux_hidden_state_layer_ids": "ints?"}
_DRAFT_SCHEMA = {**_SHARED, "causal": "bool?", "context_window": "int?"}


def _sliding_window(cfg: dict[str, Any]) -> int | None:
    """`sliding_window` as the reference sees it (z-lab reads every draft config as a Qwen3Config, which
    drops the window unless `use_sliding_window` is true, leaving SLIDING layers causal, unwindowed)."""
    window = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", False):
        return None
    return None if window is None else int(window)


# (field, neutral value): a checkpoint setting any of these elsewhere is refused at load, naming the field.
# Read from dflash_config first, then the top level (as z-lab's `_draft_value`).
_UNSUPPORTED = (("conv_kernel_size", (None, 0)), ("selector_rank", (None, 0)), ("use_swa", (None, False)),
                ("swa_window_size", (None,)), ("attention_sink_bias", (None, False)),
                ("add_swa_attention_sink_bias", (None, False)), ("is_neox_style", (None, True)),
                ("use_aux_hidden_state", (None, True)), ("hidden_act", (None, "silu")),
                ("projector_type", (None, "dflash")))


def reject_unsupported(cfg: dict[str, Any], allowed: frozenset = frozenset()) -> None:
    """NotImplementedError naming the first field whose value this implementation cannot run (but the
    names in `allowed`)."""
    draft = cfg.get("dflash_config") or {}
    for name, neutral in _UNSUPPORTED:
        if name in allowed:
            continue
        value = draft.get(name, cfg.get(name))
        if value not in neutral:
            raise NotImplementedError(f"DFlash option {name}={value!r} is not supported")
    target_hidden = cfg.get("target_hidden_size")
    if target_hidden is not None and target_hidden != cfg.get("hidden_size"):
        raise NotImplementedError(f"DFlash option target_hidden_size={target_hidden!r} != hidden_size is not supported")
    params = cfg.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise NotImplementedError(f"DFlash option rope_parameters per layer type ({sorted(params)}) is not supported")
    if SLIDING in (cfg.get("layer_types") or []) and _sliding_window(cfg) is None:
        raise NotImplementedError("DFlash option sliding_window: sliding_attention layers without a window "
                                  "(sliding_window unset or use_sliding_window false) are not supported")
    scaling = rope_scaling(cfg)
    if scaling is not None:
        if scaling["rope_type"] in SEQUENCE_DEPENDENT_ROPE:
            raise NotImplementedError(f"DFlash option rope_scaling.rope_type={scaling['rope_type']!r} is not "
                                      f"supported (its tables depend on the sequence length)")
