"""DFlash drafter configuration and its released `config.json` format.

Format (z-lab `Qwen3-8B-DFlash-b16`, mirrored in SpecForge `configs/qwen3-8b-dflash.json`;
research/dflash.md §1.1, §5): HF Qwen3 fields plus `architectures: ["DFlashDraftModel"]`, `block_size`,
`num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ARCHITECTURE = "DFlashDraftModel"


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
class DFlashConfig:
    """Shapes of a DFlash drafter. `hidden_size` must equal the target's (the drafter reads the target's
    embeddings and feeds its LM head); `vocab_size` is the target's embedding rows (padding included)."""
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    num_hidden_layers: int = 5
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    initializer_range: float = 0.02
    draft_vocab_size: int | None = None  # drafts from these LM-head rows only (buffer d2t); None: all rows

    def __post_init__(self):
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} outside [0, {self.num_target_layers}) target layers")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the embedding table [0, {self.vocab_size})")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - 1

    def to_hf_dict(self) -> dict[str, Any]:
        """The released `config.json` content (without `torch_dtype`, which the saver adds)."""
        d = dataclasses.asdict(self)
        extra = {k: d.pop(k) for k in ("mask_token_id", "target_layer_ids")}
        extra["target_layer_ids"] = list(extra["target_layer_ids"])
        return {"architectures": [ARCHITECTURE], "model_type": "qwen3", **d, "hidden_act": "silu",
                "rope_scaling": None, "attention_dropout": 0.0, "tie_word_embeddings": False,
                "layer_types": ["full_attention"] * self.num_hidden_layers, "sliding_window": None,
                "use_sliding_window": False, "dflash_config": extra}

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "DFlashConfig":
        """Parses a released DFlash `config.json`. ValueError for a non-DFlash or incomplete config;
        NotImplementedError for features this implementation does not reproduce (sliding-window
        layers, RoPE scaling, embedding/logit scaling, DFlash2 heads)."""
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise ValueError(f"not a DFlash checkpoint: architectures={cfg.get('architectures')}")
        _reject_unsupported(cfg)
        draft = cfg.get("dflash_config") or {}

        def field(name, default=None):
            return draft.get(name, cfg.get(name, default))
        if field("mask_token_id") is None:
            raise ValueError("config has no dflash_config.mask_token_id")
        n_layers = int(cfg["num_hidden_layers"])
        num_target_layers = int(cfg["num_target_layers"])
        ids = field("target_layer_ids") or build_target_layer_ids(num_target_layers, n_layers)
        heads = int(cfg["num_attention_heads"])
        return cls(hidden_size=int(cfg["hidden_size"]), intermediate_size=int(cfg["intermediate_size"]),
                   num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
                   head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                   vocab_size=int(cfg["vocab_size"]), mask_token_id=int(field("mask_token_id")),
                   target_layer_ids=ids, num_target_layers=num_target_layers, num_hidden_layers=n_layers,
                   block_size=int(field("block_size", 16)), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(rope_theta(cfg)),
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
                   attention_bias=bool(cfg.get("attention_bias", False)),
                   initializer_range=float(cfg.get("initializer_range", 0.02)),
                   draft_vocab_size=None if cfg.get("draft_vocab_size") is None else int(cfg["draft_vocab_size"]))


def rope_theta(cfg: dict[str, Any]) -> float:
    """RoPE base from `rope_theta` (transformers 4.x files) or `rope_parameters.rope_theta` (5.x)."""
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta", cfg.get("rope_theta", 10000.0))


def _reject_unsupported(cfg: dict[str, Any]) -> None:
    draft = cfg.get("dflash_config") or {}
    scaling = cfg.get("rope_scaling") or {}
    params = cfg.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type")) or params.get("rope_type", "default")
    if kind != "default":
        raise NotImplementedError(f"RoPE scaling {kind!r} is not supported")
    layer_types = set(cfg.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise NotImplementedError(f"layer_types {sorted(layer_types)}: only full_attention is supported")
    for name, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                          ("final_logit_softcapping", None), ("conv_kernel_size", None)):
        value = draft.get(name, cfg.get(name, neutral))
        if value != neutral:
            raise NotImplementedError(f"DFlash option {name}={value!r} is not supported")


def target_shape(model_config: Any) -> dict[str, Any]:
    """Layer shapes of an HF target config (Qwen3, Qwen2, Llama) for a drafter of the same width."""
    c = getattr(model_config, "text_config", None) or model_config
    heads = c.num_attention_heads
    params = getattr(c, "rope_parameters", None) or {}
    return dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_attention_heads=heads,
                num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
                head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
                rope_theta=params.get("rope_theta", getattr(c, "rope_theta", 10000.0)),
                max_position_embeddings=c.max_position_embeddings, num_target_layers=c.num_hidden_layers)
