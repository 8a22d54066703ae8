"""Tap hooks: the outputs of chosen decoder layers, read during a forward (DESIGN.md §6).

Tap i is HF `hidden_states[i + 1]` for 0-based `target_layer_ids`: decoder layer i's output, except the last
layer's, which HF (and z-lab's DFlash) take after the final norm. The decoding loop (`Target.forward`) and
feature extraction (`compute_taps`) both read taps through `tap_hooks`: forward hooks, because
`output_hidden_states` would keep every layer.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch
from torch import nn


def tap_module(layers: nn.ModuleList, norm: Optional[nn.Module], i: int) -> nn.Module:
    """The module whose output is tap i = HF `hidden_states[i + 1]`: decoder layer i, except the last
    layer, whose HF hidden state is the final norm's output (when the model has one)."""
    return norm if i == len(layers) - 1 and norm is not None else layers[i]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of an HF causal LM (`get_decoder().layers`): the modules taps hook."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        inner = getattr(model, "model", None)
        hint = (f"; this {type(model).__name__} wraps a Hugging Face model: pass its .model"
                if hasattr(inner, "get_decoder") else "")
        raise TypeError(f"{type(model).__name__}: cannot find the decoder layers "
                        f"(expected get_decoder().layers){hint}")
    return layers


def final_norm(model: nn.Module) -> Optional[nn.Module]:
    """The decoder's final norm (`get_decoder().norm`), or None."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    norm = getattr(decoder, "norm", None)
    return norm if isinstance(norm, nn.Module) else None


@contextlib.contextmanager
def tap_hooks(layers: Sequence[nn.Module], layer_ids: Sequence[int], captured: list,
              norm: Optional[nn.Module] = None):
    """Forward hooks storing tap `layer_ids[j]` in `captured[j]` (the last layer's after the final `norm`,
    when given: HF `hidden_states[L]`, see `tap_module`).

    Raises ValueError naming the bad id when one is outside [0, len(layers)).
    """
    handles = []

    def store(j):
        def hook(module, args, output):
            captured[j] = output[0] if isinstance(output, (tuple, list)) else output
        return hook
    try:
        for j, i in enumerate(layer_ids):
            if not 0 <= i < len(layers):
                raise ValueError(f"target_layer_ids: {i} is not a layer of the target "
                                 f"(tap layer id {i} out of range for a {len(layers)}-layer target)")
            handles.append(tap_module(layers, norm, i).register_forward_hook(store(j)))
        yield captured
    finally:
        for h in handles:
            h.remove()


class TapCapture:
    """What `capture_taps` yields: after a forward inside the block, `taps` holds that forward's taps."""

    def __init__(self, layer_ids: Sequence[int]):
        self.layer_ids = tuple(layer_ids)
        self.captured: list = [None] * len(self.layer_ids)

    @property
    def taps(self) -> torch.Tensor:
        """[B, T, len(layer_ids)·d] in the model's dtype: the last forward's taps, concatenated in
        `layer_ids` order (T = that forward's new tokens). RuntimeError before any forward."""
        if any(t is None for t in self.captured):
            raise RuntimeError("capture_taps: no forward ran inside the `with` block yet")
        return torch.cat(self.captured, dim=-1)


@contextlib.contextmanager
def capture_taps(model: nn.Module, layer_ids: Sequence[int]):
    """Captures taps from any HF causal LM (`get_decoder().layers`: Qwen3, Qwen2, Llama, ...).

        with capture_taps(model, drafter.target_layer_ids) as capture:
            out = model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})  # target.cache_kwarg
        taps = capture.taps          # [B, T, n_taps·d]: what drafter.extend_memory takes

    Index convention (the drafters' `target_layer_ids`): tap i is 0-based decoder layer i's output,
    HF `output_hidden_states=True`'s `hidden_states[i + 1]`; for the last layer that is after the final
    norm, as HF gives it. Forward hooks, removed on exit: nothing else of the model changes, and no other
    layer's hidden states are kept. Raises ValueError naming an id outside [0, num_layers).
    """
    capture = TapCapture(layer_ids)
    with tap_hooks(decoder_layers(model), capture.layer_ids, capture.captured, final_norm(model)):
        yield capture


@torch.inference_mode()
def compute_taps(model: nn.Module, input_ids: torch.Tensor, layer_ids: Sequence[int], *,
                 final_hidden: bool = False):
    """taps [B, T, len(layer_ids)·d] in the model's dtype for input_ids [B, T] int64 (HF causal LM).

    Runs only the decoder (`get_decoder()`): no LM head, no KV cache. final_hidden: return
    (taps, the decoder's last hidden state [B, T, d], what the LM head reads) instead.
    """
    decoder = model.get_decoder()
    captured: list = [None] * len(layer_ids)
    with tap_hooks(decoder.layers, layer_ids, captured, final_norm(model)):
        out = decoder(input_ids=input_ids.to(model.get_input_embeddings().weight.device), use_cache=False)
    taps = torch.cat(captured, dim=-1)
    return (taps, out.last_hidden_state) if final_hidden else taps
