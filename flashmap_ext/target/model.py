"""The target: an adapter over a Hugging Face causal LM used as the verifier (DESIGN.md §6).

What the decoding loop needs from the target, and nothing more:
- `forward(input_ids, cache, num_logits=n, tap_layer_ids=ids)`: one forward over new tokens that appends
  their K/V to `cache`, returns logits only for the last `n` positions (`logits_to_keep`) and the outputs
  of the tapped decoder layers (forward hooks; `output_hidden_states` would materialise every layer).
  With `attention_mask` (an additive [1, 1, T, cached + T] mask) and `position_ids` [1, T] the new tokens
  may form a tree (tree attention: each sees the cache and its own ancestors).
- `rollback(cache, n)`: drops the last n positions from the KV cache (`DynamicCache.crop(-n)`, DESIGN.md §6).
- `keep_positions(cache, keep)`: keeps only the positions `keep` (a tree round's accepted path).

Works for any `AutoModelForCausalLM` whose decoder layers sit in `get_decoder().layers` (Qwen3, Qwen2,
Llama, ...), in fp32, bf16 or fp16, on whatever device the model lives on.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from flashmap_ext.target.taps import decoder_layers, final_norm, tap_hooks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TargetOutput(NamedTuple):
    logits: torch.Tensor          # [B, num_logits, V], model dtype
    taps: Optional[torch.Tensor]  # [B, T, len(tap_layer_ids) * d], model dtype; None without taps


def resolve_dtype(dtype) -> torch.dtype:
    """Maps 'fp32'|'bf16'|'fp16' (or a torch.dtype) to a torch.dtype; raises ValueError otherwise."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of fp32, bf16, fp16 (got {dtype!r})")


def cache_kwarg(model: nn.Module) -> str:
    """The keyword `model.forward` takes its KV cache by: "cache" (transformers ≥ 5.24) or "past_key_values"
    (older; deprecated from 5.24, removed in 5.40). `model(..., **{cache_kwarg(model): cache})` works on both."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Target:
    """A causal LM plus the bookkeeping the speculative loop needs.

    Attributes:
        model: the wrapped `PreTrainedModel` (eval mode, no grad).
        layers: its decoder layers (`nn.ModuleList`), the modules that taps hook.
        embed_tokens, lm_head: the input embedding and output projection (frozen; drafters share them).
        num_layers, hidden_size, vocab_size (logit width V), max_positions (context length in tokens).
    """

    def __init__(self, model: nn.Module):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config.get_text_config(decoder=True)
        self.layers = decoder_layers(model)
        self.final_norm = final_norm(model)
        self.embed_tokens = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.num_layers = len(self.layers)
        self.hidden_size = int(self.config.hidden_size)
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 2**62)
        self._cache_kwarg = cache_kwarg(model)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(self):
        """An empty KV cache (`DynamicCache`) for one call of the decoding loop."""
        return DynamicCache(config=self.model.config)

    def forward(self, input_ids: torch.Tensor, cache, *, num_logits: int = 1,
                tap_layer_ids: Sequence[int] = (), attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> TargetOutput:
        """Runs the target over new tokens, appending their K/V to `cache`.

        Args:
            input_ids: [B, T] int64, the tokens following those already in `cache` (T >= 1).
            cache: the KV cache from `new_cache()`; updated in place.
            num_logits: number of trailing positions whose logits are computed (1 <= n <= T).
            tap_layer_ids: 0-based decoder layers whose outputs are returned (HF hidden_states[i + 1]: the
                last layer's is taken after the final norm, as HF and z-lab's DFlash do).
            attention_mask: None (causal), a padding mask [B, cached + T] int64 (1 = real position: a
                ragged batch, target/ragged.py), or an additive float mask [1, 1, T, cached + T] in the
                model's dtype (0 = visible, dtype-min = hidden), used as is (sdpa / eager attention).
            position_ids: None (cached .. cached + T - 1) or [B, T] int64 absolute positions (RoPE).
        Returns:
            TargetOutput(logits [B, num_logits, V], taps [B, T, len(ids) * d] concatenated in id order).
        Raises:
            ValueError: a layer id out of range or num_logits outside [1, T].
        """
        if not 1 <= num_logits <= input_ids.shape[1]:
            raise ValueError(f"num_logits must be in [1, {input_ids.shape[1]}] (got {num_logits})")
        attn = str(getattr(self.model.config, "_attn_implementation", None))
        if attention_mask is not None and attention_mask.dim() == 4 and "flash" in attn:
            raise ValueError(f"a custom attention mask (tree attention) needs sdpa or eager attention, "
                             f"not {attn}")
        captured: list = [None] * len(tap_layer_ids)
        with torch.inference_mode(), tap_hooks(self.layers, tap_layer_ids, captured, self.final_norm):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, logits_to_keep=num_logits, **{self._cache_kwarg: cache})
        taps = torch.cat(captured, dim=-1) if captured else None
        return TargetOutput(out.logits, taps)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype="fp32", device: Optional[str | torch.device] = None) -> "Target":
        """The causal LM of a hub name, a local directory or a local .gguf file (dequantised by transformers'
        GGUF support; needs `gguf`), in dtype "fp32" | "bf16" | "fp16" (or a torch.dtype), on `device`
        (default: cuda if available, else cpu). `load_target` also returns its tokenizer."""
        dtype = resolve_dtype(dtype)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        kwargs = {}
        if str(name_or_path).endswith(".gguf"):
            name_or_path, kwargs["gguf_file"] = os.path.split(os.path.abspath(name_or_path))
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs)
        return cls(model.to(device))

    @staticmethod
    def rollback(cache, num_tokens: int) -> None:
        """Drops the last `num_tokens` positions (>= 0) from `cache` in place."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0 (got {num_tokens})")
        if num_tokens:
            cache.crop(-num_tokens)

    @staticmethod
    def keep_positions(cache, keep: torch.Tensor) -> None:
        """Keeps only cache positions `keep` ([n] int64, ascending) in every layer, dropping the rest.

        For full-attention `DynamicLayer`s (keys/values [B, H, L, hd]; transformers 5.17–5.24); other cache
        layers (sliding window, static) raise TypeError.
        """
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise TypeError(f"keep_positions supports full-attention DynamicLayer caches, not "
                                f"{type(layer).__name__}")
            if layer.is_initialized:
                index = keep.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, index)
                layer.values = layer.values.index_select(-2, index)


def hf_causal_lm(target: Any) -> nn.Module:
    """The HF causal LM inside `target`: the model itself, or an adapter exposing it as `.model` (Target)."""
    for obj in (target, getattr(target, "model", None)):
        if obj is not None and hasattr(obj, "get_input_embeddings") and hasattr(obj, "config"):
            return obj
    raise TypeError(f"target: expected a transformers causal LM (or an adapter with `.model`), "
                    f"got {type(target).__name__}")
