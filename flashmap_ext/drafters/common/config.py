"""What the configs of drafters shaped like their target's layers (DFlash, EAGLE-3) share: the target's
layer shapes (`target_shape`), their fields and checks (`TargetShaped`), the RoPE base of a config file."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TargetShaped:
    """The target's layer shapes, as a drafter of the same width copies them (`target_shape`). Subclasses
    add `target_layer_ids` and `num_target_layers` and call `check_shapes` from `__post_init__`."""
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int

    def check_shapes(self) -> None:
        """Normalises target_layer_ids to a tuple of ints; ValueError for empty or out-of-range taps, or
        query heads that are not a multiple of the key/value heads."""
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty")
        n = self.num_target_layers  # None: unknown until a target is attached (DFlash)
        bad = [i for i in self.target_layer_ids if i < 0 or (n is not None and i >= n)]
        if bad:
            raise ValueError(f"target_layer_ids {bad} outside [0, {self.num_target_layers}) target layers")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def rope_theta(cfg: dict[str, Any]) -> float:
    """RoPE base from `rope_theta` (transformers 4.x files) or `rope_parameters.rope_theta` (5.x)."""
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta", cfg.get("rope_theta", 10000.0))


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


ENGINE_TAP_OFFSET = 1


def to_engine_layer_ids(ids) -> list[int]:
    """z-lab / SGLang / our tap ids (output of layer i = HF hidden_states[i+1]) -> the ids vLLM and
    `speculators` store in `eagle_aux_hidden_state_layer_ids` (the layer whose *input* is captured): +1."""
    return [int(i) + ENGINE_TAP_OFFSET for i in ids]


def from_engine_layer_ids(ids) -> list[int]:
    """Inverse of `to_engine_layer_ids`: vLLM / `speculators` ids -> ours (−1)."""
    return [int(i) - ENGINE_TAP_OFFSET for i in ids]


def rope_scaling(cfg: dict[str, Any]) -> dict | None:
    """The RoPE scaling parameters (`rope_scaling` of 4.x files or `rope_parameters` of 5.x) without
    `rope_theta`, `type` renamed `rope_type`; None for default RoPE."""
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    params.pop("rope_theta", None)
    kind = params.pop("rope_type", params.pop("type", "default"))
    return None if kind == "default" else {"rope_type": kind, **params}


_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
          "ints": "a list of integers", "floats": "a list of numbers"}


def _is(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    item = "float" if kind == "floats" else "int"
    return isinstance(value, (list, tuple)) and all(_is(item, v) for v in value)  # "ints", "floats"


def check_field_types(cfg: dict[str, Any], schema: dict[str, str], prefix: str = "") -> None:
    """ValueError naming the first field of `cfg` whose JSON value has the wrong type for `schema`
    (name -> "str" | "int" | "float" | "bool" | "ints" | "floats", with a trailing "?" when null is allowed). Fields absent
    from `cfg` or `schema` are not checked here. Ints are never accepted for bools nor bools for ints, and
    a float is not an int (JSON `2.5` layers); ints are accepted as floats."""
    for name, kind in schema.items():
        if name not in cfg:
            continue
        value, nullable = cfg[name], kind.endswith("?")
        kind = kind.rstrip("?")
        if value is None and nullable or _is(kind, value):
            continue
        expected = _KINDS[kind] + (" or null" if nullable else "")
        raise ValueError(f"field {prefix}{name}: expected {expected}, got {value!r} ({type(value).__name__})")
