"""`StaticTarget`: the target with static KV buffers and CUDA-graphed forwards (DESIGN.md §6).

The same interface as `Target` (new_cache / forward / rollback), computed by a plain-PyTorch decoder
(static_layers.py) over the HF model's weights:
- the KV lives in buffers [B, Hkv, capacity, hd] per layer, allocated once; the cache's length is a device
  tensor, so `rollback` is a length update and a forward's positions, KV writes and attention mask are
  computed on the device: no host read anywhere in a forward;
- forwards over T tokens with T in `graph_tokens` are captured as CUDA graphs on a GPU (the first call of a
  shape runs eagerly as the warm-up, the second captures, every later one replays); on a CPU, or for other
  T (the prompt), the same code runs eagerly;
- a graphed forward returns static output tensors, overwritten by the next forward of the same shape: the
  decoding loop consumes them before that (clone to keep them).

One cache at a time: the buffers (and the graphs, which hold their addresses) belong to the StaticTarget,
and `new_cache()` resets them, invalidating the cache it returned before. Batch rows share one length (no
ragged batches) and the mask is causal (no tree attention). The cost of the static layout: every forward
attends over all `capacity` slots, masked (for Qwen3-8B, 4 KB of bf16 KV per slot and layer).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from flashmap_ext.target.model import Target, TargetOutput
from flashmap_ext.target.static_layers import Shape, decoder_forward, layer_weights


class StaticCache:
    """The KV state of one decoding call: `length` [1] int64 on the device (what the forwards read) and
    `host_length` (the host's copy, kept by forward and rollback without any device read)."""

    def __init__(self, owner: "StaticTarget", generation: int):
        self.owner, self.generation = owner, generation

    @property
    def length(self) -> torch.Tensor:
        return self.owner._length

    @property
    def host_length(self) -> int:
        return self.owner._host_length

    def get_seq_length(self) -> int:
        return self.host_length


class StaticTarget(Target):
    """A `Target` whose forwards can be CUDA graphs (module docstring).

    Args:
        model: an HF Qwen3 / Qwen2 / Llama causal LM, or a `Target` over one (its model is used).
        capacity: KV slots (prompt + generated + one verify block of look-ahead); at most the model's context.
        batch_size: rows of every forward (1 for the decoding loop).
        graph_tokens: forward lengths T to capture as CUDA graphs (on CUDA only), e.g. (1, K + 1).
    Raises:
        TypeError: a model whose layers are not of the Qwen3/Qwen2/Llama layout, or with sliding windows.
        ValueError: capacity or batch_size < 1, capacity over the model's context, graph_tokens outside
            [1, capacity].
    """

    def __init__(self, model, capacity: int, *, batch_size: int = 1, graph_tokens: Sequence[int] = ()):
        super().__init__(model.model if isinstance(model, Target) else model)
        _check_supported(self.config)
        if capacity < 1 or capacity > self.max_positions:
            raise ValueError(f"capacity must be in [1, {self.max_positions}] (the model's context), got {capacity}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        bad = [t for t in graph_tokens if not 1 <= int(t) <= capacity]
        if bad:
            raise ValueError(f"graph_tokens must lie in [1, capacity = {capacity}], got {bad}")
        self.capacity, self.batch_size = int(capacity), int(batch_size)
        self.graph_tokens = frozenset(int(t) for t in graph_tokens)
        cfg = self.config
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.shape = Shape(int(cfg.num_attention_heads), int(cfg.num_key_value_heads), head_dim,
                           float(cfg.rms_norm_eps))
        self.weights = [layer_weights(layer) for layer in self.layers]
        # Slots allocated: capacity rounded up to 64 (SDPA kernels want the mask's last dim 16-byte aligned);
        # the ones past `capacity` are never written and always masked.
        slots = -(-capacity // 64) * 64
        self._tables(slots)
        dev, dt = self.device, self.dtype
        self._kv = [(torch.zeros(batch_size, self.shape.kv_heads, slots, head_dim, device=dev, dtype=dt),
                     torch.zeros(batch_size, self.shape.kv_heads, slots, head_dim, device=dev, dtype=dt))
                    for _ in self.layers]
        self._slots = torch.arange(slots, device=dev)
        self._length = torch.zeros(1, dtype=torch.int64, device=dev)
        self._host_length, self._generation = 0, 0
        self._graphs: dict = {}     # key -> (graph, ids buffer, outputs) once captured, "warm" before
        self._pool = None

    def _tables(self, slots: int) -> None:
        """cos/sin [slots, hd] from the HF model's own rotary embedding (its scaling included)."""
        rotary = getattr(self.model.get_decoder(), "rotary_emb", None)
        if rotary is None:
            raise TypeError(f"StaticTarget: {type(self.model).__name__} has no decoder rotary_emb")
        with torch.no_grad():
            probe = torch.zeros(1, device=self.device, dtype=self.dtype)
            cos, sin = rotary(probe, torch.arange(slots, device=self.device)[None])
        self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()

    def new_cache(self) -> StaticCache:
        """The (reset) cache: length 0. Invalidates every cache returned before."""
        self._generation += 1
        self._length.zero_()
        self._host_length = 0
        return StaticCache(self, self._generation)

    def rollback(self, cache: StaticCache, num_tokens: int) -> None:
        """Drops the last `num_tokens` positions: a length update on the device (no host read)."""
        self._check_cache(cache)
        if num_tokens < 0 or num_tokens > self._host_length:
            raise ValueError(f"num_tokens must be in [0, {self._host_length}] (got {num_tokens})")
        if num_tokens:
            self._length.sub_(num_tokens)
            self._host_length -= num_tokens

    def rollback_on_device(self, cache: StaticCache, num_tokens: torch.Tensor) -> None:
        """Drops `num_tokens` positions given as a [1] int64 device tensor (a round's k − accepted): the
        device length alone, no host read, so a CUDA graph can capture it. The host's copy keeps the longer
        length (an upper bound: the capacity checks stay safe) until `settle_host_length` is told the value."""
        self._check_cache(cache)
        self._length.sub_(num_tokens)

    def settle_host_length(self, cache: StaticCache, num_tokens: int) -> None:
        """The host half of `rollback_on_device(cache, t)` once t's value is known on the host (int)."""
        self._check_cache(cache)
        if num_tokens < 0 or num_tokens > self._host_length:
            raise ValueError(f"num_tokens must be in [0, {self._host_length}] (got {num_tokens})")
        self._host_length -= num_tokens

    def keep_positions(self, cache, keep) -> None:
        raise TypeError("StaticTarget keeps a causal chain only: tree rounds (keep_positions) need Target")

    def forward(self, input_ids: torch.Tensor, cache: StaticCache, *, num_logits: int = 1,
                tap_layer_ids: Sequence[int] = (), attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> TargetOutput:
        """`Target.forward` over the static buffers (a CUDA graph replay for T in `graph_tokens` on CUDA).

        Raises:
            ValueError: attention_mask or position_ids given (causal chains only), input_ids not
                [batch_size, T], num_logits outside [1, T], a tap layer id out of range, or the cache full.
            RuntimeError: a cache from before the latest `new_cache()`.
        """
        self._check_call(input_ids, cache, num_logits, tap_layer_ids, attention_mask, position_ids)
        T, taps = input_ids.shape[1], tuple(int(i) for i in tap_layer_ids)
        key = (T, num_logits, taps)
        if self.device.type != "cuda" or T not in self.graph_tokens or torch.cuda.is_current_stream_capturing():
            out = self._eager(input_ids, num_logits, taps)
        else:
            out = self._graphed(key, input_ids)
        self._host_length += T
        return out

    def _eager(self, input_ids: torch.Tensor, num_logits: int, taps: tuple) -> TargetOutput:
        """The forward itself; advances the device length by T."""
        T = input_ids.shape[1]
        with torch.inference_mode():
            pos = self._length + torch.arange(T, device=self.device)
            visible = self._slots[None, :] <= pos[:, None]
            x = self.embed_tokens(input_ids)
            x, tapped = decoder_forward(x, self.weights, self.shape, self._kv, pos, self._cos[pos], self._sin[pos],
                                        visible, self.final_norm.weight, taps)
            logits = self.lm_head(x[:, T - num_logits:])
            self._length.add_(T)
        return TargetOutput(logits, torch.cat(tapped, dim=-1) if tapped else None)

    def _graphed(self, key: tuple, input_ids: torch.Tensor) -> TargetOutput:
        """First call of a shape: eager (the warm-up); second: capture; then replay."""
        entry = self._graphs.get(key)
        if entry is None:
            self._graphs[key] = "warm"
            return self._eager(input_ids, key[1], key[2])
        if entry == "warm":
            entry = self._graphs[key] = self._capture(key, input_ids)
        graph, ids, out = entry
        ids.copy_(input_ids)
        graph.replay()
        return out

    def _capture(self, key: tuple, input_ids: torch.Tensor) -> tuple:
        ids = input_ids.clone()
        graph = torch.cuda.CUDAGraph()
        self._pool = self._pool or torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._eager(ids, key[1], key[2])
        return graph, ids, out

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, StaticCache) or cache.owner is not self:
            raise TypeError(f"cache: expected this StaticTarget's new_cache(), got {type(cache).__name__}")
        if cache.generation != self._generation:
            raise RuntimeError("cache: a StaticTarget holds one cache at a time; this one was reset by a later "
                               "new_cache()")

    def _check_call(self, input_ids, cache, num_logits, tap_layer_ids, attention_mask, position_ids) -> None:
        self._check_cache(cache)
        if attention_mask is not None or position_ids is not None:
            which = "attention_mask" if attention_mask is not None else "position_ids"
            raise ValueError(f"{which}: StaticTarget runs causal chains only (no ragged batches or trees); "
                             f"use Target for those")
        if input_ids.dim() != 2 or input_ids.shape[0] != self.batch_size or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids must be [batch_size = {self.batch_size}, T >= 1], "
                             f"got {tuple(input_ids.shape)}")
        T = input_ids.shape[1]
        if not 1 <= num_logits <= T:
            raise ValueError(f"num_logits must be in [1, {T}] (got {num_logits})")
        bad = [i for i in tap_layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"target_layer_ids: {bad[0]} is not a layer of the target (tap layer id {bad[0]} "
                             f"out of range for a {self.num_layers}-layer target)")
        if self._host_length + T > self.capacity:
            raise ValueError(f"StaticTarget cache full: {self._host_length} + {T} new tokens exceed its capacity "
                             f"of {self.capacity} slots")


def _check_supported(cfg) -> None:
    """TypeError for configurations the static decoder does not compute (sliding-window attention)."""
    layer_types = getattr(cfg, "layer_types", None) or ()
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise TypeError("StaticTarget: sliding-window attention layers are not supported; use Target")


def static_target_for(target: Target, capacity: int, graph_tokens: Sequence[int]) -> StaticTarget:
    """A StaticTarget over `target`'s model with at least `capacity` slots and `graph_tokens` graphed:
    `target` itself when it is one that fits, else one kept on `target` for later calls (a new one when
    the capacity grows: capacity rounded up to 256 slots, capped at the context)."""
    if isinstance(target, StaticTarget):
        if target.capacity < capacity:
            raise ValueError(f"StaticTarget capacity {target.capacity} < the {capacity} slots this call needs")
        return target
    kept: Optional[StaticTarget] = getattr(target, "_static", None)
    tokens = frozenset(graph_tokens)
    if kept is None or kept.capacity < capacity or not tokens <= kept.graph_tokens:
        capacity = min(-(-capacity // 256) * 256, target.max_positions)
        tokens = tokens | (kept.graph_tokens if kept is not None else frozenset())
        target._static = kept = None  # free the old buffers (and graphs) before allocating the new ones
        target._static = kept = StaticTarget(target, capacity, graph_tokens=sorted(tokens))
    return kept


__all__ = ["StaticTarget", "StaticCache", "static_target_for"]
