"""DFlash block-diffusion drafter (baseline; DESIGN.md §1, §11).

One forward drafts a whole block: the block `[anchor, MASK × (block_size−1)]` at absolute positions
`p … p+block_size−1` goes through Qwen3-style layers whose attention also sees "injected" context K/V:
the target's tapped hidden states, fused once by `hidden_norm(fc(concat taps))`, projected by each
layer's own k_proj/v_proj (+k_norm, RoPE at the context's absolute positions). The block attends to all
context and bidirectionally to itself; slot k ≥ 1 predicts the token at p+k (same-position prediction),
draft = argmax of the target's LM head. Embedding and LM head are the target's, frozen, never stored.
Sources: z-lab/dflash `dflash/model.py` (inference), SpecForge `specforge/core/dflash.py` (training).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch
from torch import nn

from flashmap_ext.checks import check_int
from flashmap_ext.drafters.common import checkpoint as ckpt
from flashmap_ext.drafters.common.base import ReadsTarget, check_memory_ids, check_memory_type, own_memory
from flashmap_ext.drafters.common.config import target_shape
from flashmap_ext.drafters.common.kv_cache import KVCache
from flashmap_ext.drafters.common.layers import Attention, RMSNorm, Rotary, init_weights, swiglu
from flashmap_ext.drafters.common.vocab import DraftVocab
from flashmap_ext.drafters.common.window import window_start
from flashmap_ext.drafters.dflash.blocks import (
    attention_rule,
    ragged_structure,
    train_attention_mask,
    train_block_inputs,
)
from flashmap_ext.drafters.dflash.config import DFlashConfig, build_target_layer_ids
from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.tables import TargetTables

DFlashMemory = KVCache  # per-layer context K/V of the committed positions


class DFlashLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer whose attention gets the context K/V as a prefix."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                   c.head_dim, qk_norm=True, eps=c.rms_norm_eps, bias=c.attention_bias)
        self.mlp = swiglu(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)[0]
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(ReadsTarget, nn.Module):
    """DFlash drafter implementing `flashmap_ext.drafters.common.base.BlockDrafter`.

    Weights (released names): `layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.self_attn.{q,k}_norm`,
    `layers.{i}.mlp.{gate,up,down}_proj`, `layers.{i}.{input,post_attention}_layernorm`, `fc`,
    `hidden_norm`, `norm`. Call `attach_target` (or pass `target`) before drafting or training.
    """

    layer_type = DFlashLayer  # a subclass may wrap the layers (DFlash2)
    kind, label = "dflash", "DFlash drafter"  # checkpoint kind (common/checkpoint.py) and its name in errors
    config_type = DFlashConfig
    # `--add-layers` (train/warm_start.py): the stack a deeper drafter extends, and its layer-count fields
    layer_prefix, depth_fields = "layers.", ("num_hidden_layers", "layer_types")
    memory_type = DFlashMemory  # what new_memory makes (draft_block refuses another drafter's)
    memory_proj = "fc"  # its weight dtype is the memory's (memory_dtype)

    def __init__(self, config: DFlashConfig, target: Any = None):
        super().__init__()
        c = self.config = config
        self.layers = nn.ModuleList(self.layer_type(c) for _ in range(c.num_hidden_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.rope_scaling,
                             dict(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                                  max_position_embeddings=c.max_position_embeddings))
        init_weights(self, c.initializer_range)
        if c.draft_vocab_size is not None:  # EAGLE-3 convention: target id = draft id + d2t[draft id]
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        if target is not None:
            self.attach_target(target)

    @staticmethod
    def identity_layer_init(layer: nn.Module) -> None:
        """Zeroes the layer's residual outputs (attention `o_proj`, MLP `down_proj`): it passes its input on."""
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()

    # --- BlockDrafter protocol -------------------------------------------------------------------
    @property
    def num_draft_tokens(self) -> int:
        return self.config.block_size - 1

    @property
    def target_layer_ids(self) -> Sequence[int]:
        return self.config.target_layer_ids

    def new_memory(self, batch_size: int, device: torch.device | str | None = None) -> DFlashMemory:
        """Empty context cache for `batch_size` sequences (all rows share one length). Entries get
        positions 0, 1, … in the order they are appended: the memory index is the absolute position, as
        in the loop's contract (memory = every committed position except the anchor)."""
        check_int(f"{type(self).__name__}.new_memory: batch_size", batch_size, 1)
        c, w = self.config, self.fc.weight
        return own_memory(self, KVCache.empty(len(self.layers), batch_size, c.num_key_value_heads, c.head_dim,
                                              w.dtype, device or w.device))

    @torch.no_grad()
    def extend_memory(self, memory: DFlashMemory, token_ids: torch.Tensor, taps: torch.Tensor | None) -> None:
        """Appends the K/V of T committed positions (at absolute positions L … L+T−1) to every layer.

        token_ids: [B, T] int64 ids of the target's vocabulary (checked, else ValueError / TypeError naming
        `token_ids`; unused otherwise: DFlash context is the taps alone); taps: [B, T, n_taps·d].
        """
        check_memory_type(self, memory)
        check_memory_ids(token_ids, self.config.vocab_size)
        if taps is None:
            raise ValueError("DFlash needs target taps to extend its memory")
        self._check_taps(taps, memory.batch, token_ids.shape[1])
        positions = torch.tensor(memory.rows, device=taps.device)[:, None] + torch.arange(taps.shape[1],
                                                                                          device=taps.device)
        memory.append(self._context_kv(taps, positions))  # row b's from its own length on (ragged rows)

    @torch.no_grad()
    def draft(self, memory: DFlashMemory, anchor_tokens: torch.Tensor, *, num_tokens: int,
              seed: torch.Tensor | None = None, position: torch.Tensor) -> torch.Tensor:
        """Greedy drafts [B, num_tokens] int64 (DFlash is deterministic: `seed` is unused). The full
        block is always run (as in training) and its first `num_tokens` slots are returned."""
        return self.draft_with_logits(memory, anchor_tokens, num_tokens=num_tokens, position=position)[0]

    @torch.no_grad()
    def draft_with_logits(self, memory: DFlashMemory, anchor_tokens: torch.Tensor, *, num_tokens: int,
                          seed: torch.Tensor | None = None,
                          position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` and its logits: (tokens [B, num_tokens] int64, logits [B, num_tokens, V_d] over the
        draft vocabulary's rows, in the weights' dtype)."""
        if not 0 <= num_tokens <= self.num_draft_tokens:
            raise ValueError(f"num_tokens must be in [0, {self.num_draft_tokens}], got {num_tokens}")
        logits = self.vocab_logits(self.block_hidden(memory, anchor_tokens, position)[:, :num_tokens])
        return self.vocab.to_target(logits.argmax(-1)), logits

    # --- draft vocabulary ----------------------------------------------------------------------------
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Sets the draft vocabulary: [draft_vocab_size] distinct target ids."""
        self.d2t.copy_(DraftVocab.offsets(token_ids, self.config.draft_vocab_size))
        if self._tables is not None:
            self._tables = self._tables.with_rows(self.vocab.target_ids)

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits over the draft vocabulary [..., V_d] (all of the LM head without one)."""
        return self.scale_logits(self.tables.logits(hidden))

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """`output_multiplier`, then `final_logit_softcapping` c > 0: c·tanh(logits / c) (z-lab
        `compute_logits`); the identity for v1 checkpoints."""
        c = self.config
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping is not None and c.final_logit_softcapping > 0:
            logits = torch.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
        return logits

    def to_draft_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft-vocabulary rows; −100 and ids outside the draft vocabulary -> −100."""
        return self.vocab.to_draft(token_ids)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.vocab.to_target(draft_ids)

    # --- inference pieces --------------------------------------------------------------------------
    @torch.no_grad()
    def draft_logits(self, memory: DFlashMemory, anchor_tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Logits [B, block_size−1, V] of the draft slots for anchors at absolute `position` [B]
        (−inf outside the draft vocabulary, if any)."""
        hidden = self.block_hidden(memory, anchor_tokens, position)
        rows = self.vocab.target_ids
        if rows is None:
            return self.vocab_logits(hidden)
        small = self.vocab_logits(hidden)
        full = small.new_full((*small.shape[:-1], self.tables.shape[0]), float("-inf"))
        return full.index_copy_(-1, rows.to(small.device), small)

    def block_hidden(self, memory: DFlashMemory, anchor_tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states [B, block_size−1, d] of slots 1…block_size−1. Full-attention
        bidirectional layers see all of row b's lengths[b] memory entries (their last
        `config.context_window` with a window) and the whole block; causal / sliding-window layers (`DFlashConfig.layer_attention`)
        are masked by absolute position (memory index = position)."""
        bs, b = self.config.block_size, anchor_tokens.shape[0]
        if anchor_tokens.dim() != 1 or position.shape != anchor_tokens.shape:
            raise ValueError(f"anchor_tokens and position must both be [B]; got {tuple(anchor_tokens.shape)} "
                             f"and {tuple(position.shape)}")
        if memory.batch != b:
            raise ValueError(f"memory holds {memory.batch} rows, anchors {b}")
        ids = torch.full((b, bs), self.config.mask_token_id, dtype=torch.long, device=anchor_tokens.device)
        ids[:, 0] = anchor_tokens
        x = self._embed(ids)
        block_pos = position[:, None] + torch.arange(bs, device=position.device)
        cos, sin = self.rotary(block_pos, x.dtype)
        window = self.config.context_window
        start = window_start(min(memory.rows), window)
        ctx_pos = torch.arange(start, memory.length, device=position.device).expand(b, -1)
        structure = ragged_structure(memory.lengths, start, window, bs).to(x.device) if memory.ragged else None
        masks = self._layer_masks(block_pos, torch.cat([ctx_pos, block_pos], 1), structure)
        for layer, k, v, mask in zip(self.layers, memory.keys, memory.values, masks):
            x = layer(x, cos, sin, k[:, :, start:], v[:, :, start:], mask)
        return self.norm(x)[:, 1:]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tables.embed(ids, self.fc.weight.dtype)
        scale = self.config.input_embedding_scale
        return x if scale == 1.0 else x * scale

    def _layer_masks(self, query_pos: torch.Tensor, key_pos: torch.Tensor, structure: torch.Tensor | None):
        """Per layer: `structure` (bool [B, 1, Q, K] or None = all visible) combined with the layer's
        causal / sliding-window rule over absolute positions query_pos [B, Q], key_pos [B, K]."""
        cache: dict = {}
        out = []
        for i in range(len(self.layers)):
            causal, window = self.config.layer_attention(i)
            if (causal, window) not in cache:
                if not causal and window is None:
                    cache[causal, window] = structure
                else:
                    rule = attention_rule(query_pos, key_pos, causal, window)[:, None]
                    cache[causal, window] = rule if structure is None else rule & structure
            out.append(cache[causal, window])
        return out

    def _context_kv(self, taps: torch.Tensor, positions: torch.Tensor):
        """Per layer (k, v) [B, G, T, hd] of the fused taps at absolute `positions` [B, T]."""
        ctx = self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions, ctx.dtype)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def _check_taps(self, taps: torch.Tensor, batch: int, length: int) -> None:
        width = len(self.config.target_layer_ids) * self.config.hidden_size
        if taps.dim() != 3 or taps.shape != (batch, length, width):
            raise ValueError(f"taps must be [B={batch}, T={length}, n_taps·d={width}], got {tuple(taps.shape)}")

    # --- training ------------------------------------------------------------------------------------
    def forward_train(self, taps: torch.Tensor, input_ids: torch.Tensor, anchor_pos: torch.Tensor) -> torch.Tensor:
        """Logits [B, A, block_size−1, V] for A blocks per sequence in one forward (SpecForge-style).
        See `forward_train_hidden` for the inputs."""
        hidden = self.forward_train_hidden(taps, input_ids, anchor_pos)
        return self.scale_logits(self.tables.full_logits(hidden))

    def forward(self, taps: torch.Tensor, input_ids: torch.Tensor, anchor_pos: torch.Tensor) -> torch.Tensor:
        """`forward_train_hidden`, the module's call (so DDP/FSDP wrappers see the training forward)."""
        return self.forward_train_hidden(taps, input_ids, anchor_pos)

    def forward_train_hidden(self, taps: torch.Tensor, input_ids: torch.Tensor,
                             anchor_pos: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states [B, A, block_size−1, d] of the draft slots of A blocks.

        taps [B, T, n_taps·d] (target taps at every position), input_ids [B, T] int64, anchor_pos [B, A]
        int64 in [0, T) or −1 for a padded block. Block a is [input_ids[anchor], MASK…] at positions
        anchor … anchor+block_size−1 and sees the context strictly before its anchor (as at inference,
        where the anchor's own taps do not exist yet; the last `config.context_window` positions of it
        with a window) and its own block; never another block.
        """
        b, t = input_ids.shape
        self._check_taps(taps, b, t)
        ids, block_pos = train_block_inputs(input_ids, anchor_pos, self.config)
        structure = train_attention_mask(anchor_pos, t, self.config.block_size, self.config.context_window)
        x = self._embed(ids)
        ctx_pos = torch.arange(t, device=taps.device).expand(b, -1)
        ctx_kv = self._context_kv(taps, ctx_pos)
        cos, sin = self.rotary(block_pos, x.dtype)
        masks = self._layer_masks(block_pos, torch.cat([ctx_pos, block_pos], 1), structure)
        for layer, (k, v), mask in zip(self.layers, ctx_kv, masks):
            x = layer(x, cos, sin, k, v, mask)
        a, bs = anchor_pos.shape[1], self.config.block_size
        return self.norm(x).view(b, a, bs, -1)[:, :, 1:]

    # --- target, construction, checkpoints -----------------------------------------------------------
    def attach_target(self, target: Any) -> "DFlashDrafter":
        """Uses `target`'s frozen embedding and LM head (held by reference, never stored)."""
        self.check_target(target)
        parts = TargetTables.from_target(target, self.vocab.target_ids)
        self._tables = parts
        return self

    @classmethod
    def for_target(cls, target: Any, *, tokenizer: Any = None, num_taps: int | None = None,
                   dtype: torch.dtype | None = None, **overrides: Any) -> "DFlashDrafter":
        """A randomly initialised drafter shaped like `target`'s layers (DFlash recipe: 5 layers, block 16,
        taps spread over layers 1…L−3). `mask_token_id`: from `overrides`, else `len(tokenizer)` (the
        first padding row, as DFlash's 151669 for Qwen3) when the embedding table has spare rows; else
        ValueError asking for one. Any DFlashConfig field may be overridden. Device: the target's;
        dtype: `dtype`, default the target embedding's (pass torch.float32 to train under autocast)."""
        model = hf_causal_lm(target)
        rows = model.get_input_embeddings().weight.shape[0]
        shape = target_shape(model.config)
        n_layers = overrides.get("num_hidden_layers", 5)
        if "target_layer_ids" not in overrides:
            overrides["target_layer_ids"] = build_target_layer_ids(shape["num_target_layers"], num_taps or n_layers)
        if "mask_token_id" not in overrides:
            if tokenizer is None or len(tokenizer) >= rows:
                stage = "dflash2" if cls.__name__ == "DFlash2Drafter" else "dflash"
                known = "no tokenizer given" if tokenizer is None else f"the tokenizer has {len(tokenizer)} tokens"
                raise ValueError(f"no spare embedding row known for the mask token (the table has {rows} rows, "
                                 f"{known}): pass mask_token_id= (flashmap train {stage}: --mask-token-id), "
                                 "a row that no prompt token uses")
            overrides["mask_token_id"] = len(tokenizer)
        config = cls.config_type(**{**shape, "vocab_size": rows, **overrides})
        weight = model.get_input_embeddings().weight
        return cls(config, target).to(device=weight.device, dtype=dtype or weight.dtype)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, target: Any = None, *, dtype: torch.dtype | str | None = None,
                        device: torch.device | str | None = None) -> "DFlashDrafter":
        """Loads a released-format DFlash checkpoint (config.json + safetensors). Weights keep their
        stored dtype unless `dtype` is given; device defaults to the target's embedding device. A stored
        `lm_head.weight` (the draft vocabulary's head in vLLM's layout, release.py) is not loaded: the head
        is the target's; with `target` given, UnsupportedCheckpoint unless it equals the target's rows."""
        dtype = ckpt.check_load_args(path, dtype, cls.__name__)
        config = ckpt.load_config(path, cls.kind, cls.parse_config)
        weights = {k.removeprefix("model."): v for k, v in ckpt.read_weights(path, cls.kind).items()
                   if not k.endswith("rotary_emb.inv_freq")}
        head = weights.pop("lm_head.weight", None) if config.draft_vocab_size is not None else None
        drafter = ckpt.build_loaded(cls, config, weights, f"{path} ({cls.label})", target, device, dtype)
        if head is not None and target is not None:
            own = drafter._tables.head_weight
            if head.shape != own.shape or not torch.equal(head, own.to("cpu", head.dtype)):
                raise ckpt.UnsupportedCheckpoint(f"{path} ({cls.label}): its lm_head.weight is not the "
                                                 "target's LM-head rows of the draft vocabulary (a trained "
                                                 "draft head is not supported)")
        return drafter

    @staticmethod
    def parse_config(cfg: dict) -> DFlashConfig:
        """The drafter's config from a checkpoint's parsed config.json."""
        return DFlashConfig.from_hf_dict(cfg)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Writes the released DFlash format: config.json + model.safetensors (no embedding/LM head)."""
        config = {**self.config.to_hf_dict(), "torch_dtype": ckpt.dtype_name(self.fc.weight.dtype)}
        ckpt.write_checkpoint(path, config, self)
