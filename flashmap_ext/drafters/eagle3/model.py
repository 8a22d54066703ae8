"""EAGLE-3 drafter (baseline; arXiv:2503.01840, SafeAILab/EAGLE `eagle/traineagle3/cnets.py`,
SpecForge `llama3_eagle.py`; DESIGN.md §11).

Position s of the context is the pair (g_s, x_{s+1}): g_s = fc(low ‖ mid ‖ high taps at s) and the
embedding of the *next* token. One Llama decoder layer reads [input_layernorm(emb) ‖ hidden_norm(g)]
(2·d wide) with the residual on g; its output o_s, through `norm` and the drafter's own LM head over a
draft vocabulary subset (target id = draft id + d2t[draft id]), predicts x_{s+2}. Drafting is
autoregressive: step j feeds (o from step j−1, the token drafted at step j−1) at position s+j and
attends to the cached context pairs and the chain so far. Only the target's embedding is borrowed
(frozen, never stored); checkpoints omit `embed_tokens`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from flashmap_ext.checks import check_int
from flashmap_ext.drafters.common import checkpoint as ckpt
from flashmap_ext.drafters.common.base import (
    ReadsTarget,
    check_memory_ids,
    check_memory_type,
    config_fits,
    own_memory,
    truncated,
)
from flashmap_ext.drafters.common.config import target_shape
from flashmap_ext.drafters.common.kv_cache import KVCache
from flashmap_ext.drafters.common.layers import Attention, RMSNorm, Rotary, init_weights, swiglu
from flashmap_ext.drafters.common.vocab import DraftVocab
from flashmap_ext.drafters.eagle3 import formats
from flashmap_ext.drafters.eagle3.config import Eagle3Config, eagle3_layer_ids
from flashmap_ext.drafters.eagle3.tree import DraftTree, draft_tree
from flashmap_ext.drafters.eagle3.ttt import ttt_forward
from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.tables import TargetTables


@dataclass
class Eagle3Memory:
    """K/V of the committed pairs (positions 0 … L−2 of a row with L committed positions) and g of the last
    committed position [B, 1, d], waiting for the token after it (the anchor) to form a pair. `g` keeps
    every committed position's g [B, capacity, d] (left-aligned per row), so `truncate` can restore the
    pending one; rows may hold different lengths (a ragged batch)."""
    cache: KVCache
    pending: torch.Tensor | None = None
    g: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the entries were made in (the drafter's when it filled them)."""
        return self.cache.dtype

    @property
    def rows(self) -> list:
        """Committed positions per row (Python ints): the pairs, plus the pending position."""
        return [n + (self.pending is not None) for n in self.cache.rows]

    @property
    def lengths(self) -> torch.Tensor:
        """[B] int64 (CPU): committed positions per row (the cached pairs and the pending one)."""
        return torch.tensor(self.rows, dtype=torch.int64)

    def write_g(self, g: torch.Tensor) -> None:
        """Stores g [B, T, d] of T new positions, row b's from its own length on (before they are counted)."""
        starts, T = self.rows, g.shape[1]
        end = max(starts) + T
        if self.g is None or self.g.shape[1] < end:
            grown = g.new_zeros(g.shape[0], max(end, 2 * (0 if self.g is None else self.g.shape[1])), g.shape[2])
            if self.g is not None:
                grown[:, :self.g.shape[1]] = self.g
            self.g = grown
        for b, s in enumerate(starts):
            self.g[b, s:s + T] = g[b]

    def truncate(self, lengths) -> None:
        """Cuts row b back to its first lengths[b] >= 1 positions (ValueError naming `lengths` otherwise)."""
        new = truncated(self.rows, lengths)
        if min(new) < 1:
            raise ValueError(f"lengths: an EAGLE-3 memory keeps at least one position per row, got {new}")
        self.cache.truncate([n - 1 for n in new])
        self.pending = self.g[torch.arange(len(new)), torch.tensor(new) - 1][:, None]


class Eagle3Layer(nn.Module):
    """The EAGLE-3 decoder layer (`midlayer`): attention over [emb ‖ hidden] (2·d) and a SwiGLU MLP."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        d = c.hidden_size
        self.self_attn = Attention(2 * d, d, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   qk_norm=c.qk_norm, eps=c.rms_norm_eps)
        self.mlp = swiglu(d, c.intermediate_size)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.norm_before_residual = c.norm_before_residual

    def _input(self, hidden, emb, normed=None):
        normed = self.hidden_norm(hidden) if normed is None else normed
        return torch.cat([self.input_layernorm(emb), normed], dim=-1)

    def kv(self, hidden, emb, cos, sin):
        """(k, v) [B, G, L, hd] of pairs (hidden, emb) [B, L, d] (what the cache stores)."""
        return self.self_attn.kv(self._input(hidden, emb), cos, sin)

    def forward(self, hidden, emb, cos, sin, prefix_k=None, prefix_v=None, mask=None):
        """-> (output o [B, L, d] (pre-`norm`), k, v of the L new pairs)."""
        normed = self.hidden_norm(hidden)
        a, k, v = self.self_attn(self._input(hidden, emb, normed), cos, sin, prefix_k, prefix_v, mask)
        h = (normed if self.norm_before_residual else hidden) + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class Eagle3Drafter(ReadsTarget, nn.Module):
    """EAGLE-3 chain drafter implementing `flashmap_ext.drafters.common.base.BlockDrafter`.

    Weights (SpecForge names): `fc`, `midlayer.*`, `norm`, `lm_head` [draft_vocab, d]; buffers `d2t`
    [draft_vocab] int64 (target id − draft id) and `t2d` [V] bool (target id is in the draft vocab).
    With `config.frozen_lm_head` the `lm_head` is the target's draft-vocabulary rows: not trained, not
    saved, rebuilt from the target by `from_pretrained`.
    """

    memory_type = Eagle3Memory  # what new_memory makes (draft_block refuses another drafter's)
    memory_proj = "fc"  # its weight dtype is the memory's (memory_dtype)

    def __init__(self, config: Eagle3Config, target: Any = None):
        super().__init__()
        c = self.config = config
        width = len(c.target_layer_ids) * c.hidden_size
        self.input_norm = RMSNorm(width, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc = nn.Linear(width, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(not c.frozen_lm_head)
        self.rotary = Rotary(c.head_dim, c.rope_theta)
        # default draft vocabulary: target ids 0 … draft_vocab−1 (d2t = 0)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(c.vocab_size) < c.draft_vocab_size)
        init_weights(self, c.initializer_range)
        if target is not None:
            self.attach_target(target)

    # --- vocabulary --------------------------------------------------------------------------------
    @property
    def draft_ids(self) -> torch.Tensor:
        """[draft_vocab] int64: the target id of each draft-vocabulary row."""
        return self.vocab.target_ids

    @torch.no_grad()
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Sets d2t/t2d from [draft_vocab] distinct target ids (row order = LM-head row order)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long, device=self.d2t.device)
        self.d2t.copy_(DraftVocab.offsets(ids, self.d2t.shape[0], self.t2d.shape[0], sort=False))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_to_draft(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids [...] -> draft-vocab rows [...], −100 (vocab.IGNORE) where the id is not in the draft
        vocabulary."""
        return self.vocab.to_draft(token_ids)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer outputs o [..., d] -> draft-vocab logits [..., draft_vocab]."""
        return self.lm_head(self.norm(out))

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """g = fc(taps) [..., d] (fc(input_norm(taps)) with `norm_before_fc`)."""
        x = taps.to(self.fc.weight.dtype)
        return self.fc(x if self.input_norm is None else self.input_norm(x))

    def carry(self, out: torch.Tensor) -> torch.Tensor:
        """The hidden state a drafting step hands the next: o, or norm(o) with `norm_output`."""
        return self.norm(out) if self.config.norm_output else out

    # --- BlockDrafter protocol -------------------------------------------------------------------
    @property
    def num_draft_tokens(self) -> int:
        return self.config.num_draft_tokens

    @property
    def target_layer_ids(self) -> Sequence[int]:
        return self.config.target_layer_ids

    def new_memory(self, batch_size: int, device: torch.device | str | None = None) -> Eagle3Memory:
        """Empty memory for `batch_size` sequences (rows may come to hold different lengths: `truncate`)."""
        check_int(f"{type(self).__name__}.new_memory: batch_size", batch_size, 1)
        c, w = self.config, self.fc.weight
        cache = KVCache.empty(1, batch_size, c.num_key_value_heads, c.head_dim, w.dtype, device or w.device)
        return own_memory(self, Eagle3Memory(cache))

    @torch.no_grad()
    def extend_memory(self, memory: Eagle3Memory, token_ids: torch.Tensor, taps: torch.Tensor | None) -> None:
        """Commits T positions: tokens [B, T] int64 and their taps [B, T, n_taps·d]. Pairs whose next
        token is now known enter the cache; the last position's g waits in `pending`. The tokens are embedded:
        ValueError / TypeError naming `token_ids` unless they are [B, T] integer ids of the target's vocabulary."""
        check_memory_type(self, memory)
        check_memory_ids(token_ids, self.config.vocab_size)
        b, t = token_ids.shape
        width = len(self.config.target_layer_ids) * self.config.hidden_size
        if taps is None or taps.shape != (b, t, width) or memory.cache.batch != b:
            raise ValueError(f"taps must be [B={memory.cache.batch}, T={t}, n_taps·d={width}], "
                             f"got {None if taps is None else tuple(taps.shape)}")
        if t == 0:
            return
        g = self.fuse(taps)
        memory.write_g(g)
        if memory.pending is not None:  # row b's pairs (g_s, x_{s+1}) for s = rows[b] − 1 … rows[b] + t − 2
            pairs_g, nxt = torch.cat([memory.pending, g], dim=1)[:, :t], token_ids
        else:
            pairs_g, nxt = g[:, :t - 1], token_ids[:, 1:]
        n = nxt.shape[1]
        if n:
            pos = torch.tensor(memory.cache.rows, device=g.device)[:, None] + torch.arange(n, device=g.device)
            cos, sin = self.rotary(pos, g.dtype)
            memory.cache.append([self.midlayer.kv(pairs_g, self.tables.embed(nxt, g.dtype), cos, sin)])
        memory.pending = g[:, -1:]

    @torch.no_grad()
    def draft(self, memory: Eagle3Memory, anchor_tokens: torch.Tensor, *, num_tokens: int,
              seed: torch.Tensor | None = None, position: torch.Tensor) -> torch.Tensor:
        """Greedy chain of `num_tokens` target ids [B, num_tokens] (deterministic: `seed` unused)."""
        return self.draft_with_logits(memory, anchor_tokens, num_tokens=num_tokens, position=position)[0]

    @torch.no_grad()
    def draft_with_logits(self, memory: Eagle3Memory, anchor_tokens: torch.Tensor, *, num_tokens: int,
                          seed: torch.Tensor | None = None,
                          position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`draft` and its logits: (tokens [B, num_tokens] int64, logits [B, num_tokens, V_d] over the
        draft vocabulary, in the weights' dtype)."""
        if not 0 <= num_tokens <= self.num_draft_tokens:
            raise ValueError(f"num_tokens must be in [0, {self.num_draft_tokens}], got {num_tokens}")
        logits, tokens = self.chain(memory, anchor_tokens, position, num_tokens)
        return tokens, logits

    def chain(self, memory: Eagle3Memory, anchor_tokens: torch.Tensor, position: torch.Tensor, steps: int,
              forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs `steps` drafting steps from the anchor at absolute `position` [B].

        forced: optional [B, steps−1] target ids fed as the inputs of steps 1… instead of the drafts
        (teacher forcing, for tests). Returns (draft-vocab logits [B, steps, Vd], drafts [B, steps] target ids).
        """
        if memory.pending is None:
            raise ValueError("empty memory: extend_memory with at least one committed position first")
        if anchor_tokens.dim() != 1 or position.shape != anchor_tokens.shape:
            raise ValueError("anchor_tokens and position must both be [B]")
        hidden, token = memory.pending, anchor_tokens
        keys, values = memory.cache.keys[0], memory.cache.values[0]
        visible = None  # rows of different lengths: each step sees its row's pairs and its own chain
        if memory.cache.ragged:
            visible = torch.arange(keys.shape[2])[None] < memory.cache.lengths[:, None]
        logits, drafts = [], []
        for j in range(steps):
            cos, sin = self.rotary((position - 1 + j)[:, None], hidden.dtype)
            emb = self.tables.embed(token[:, None], hidden.dtype)
            mask = None
            if visible is not None:
                mask = torch.cat([visible, visible.new_ones(len(visible), j + 1)], 1)[:, None, None].to(keys.device)
            out, k, v = self.midlayer(hidden, emb, cos, sin, keys, values, mask)
            keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
            logits.append(self.draft_logits(out)[:, 0])
            hidden = self.carry(out)
            drafts.append(self.draft_ids[logits[-1].argmax(-1)])
            token = forced[:, j] if forced is not None and j < steps - 1 else drafts[-1]
        vd = self.config.draft_vocab_size
        empty = anchor_tokens.new_zeros(anchor_tokens.shape[0], 0)
        return (torch.stack(logits, 1) if logits else hidden.new_zeros(anchor_tokens.shape[0], 0, vd),
                torch.stack(drafts, 1) if drafts else empty)

    def draft_tree(self, memory: Eagle3Memory, anchor_token: torch.Tensor, position: torch.Tensor, *,
                   depth: int = 7, topk: int = 10, num_nodes: int = 16) -> DraftTree:
        """EAGLE-2-style dynamic draft tree (batch 1); see `drafters/eagle3/tree.py` and `flashmap_ext/tree.py`."""
        return draft_tree(self, memory, anchor_token, position, depth=depth, topk=topk, num_nodes=num_nodes)

    # --- training (training-time test) ------------------------------------------------------------
    def forward(self, taps: torch.Tensor, input_ids: torch.Tensor, anchor_pos: torch.Tensor,
                steps: int = 7) -> torch.Tensor:
        """Draft-vocab logits [B, A, steps, Vd] of the training-time test unrolled from A anchors.

        Anchor a (the last committed token) starts at the pair (g_{a−1}, x_a) at position a−1 and sees
        the pairs before it; step j ≥ 1 feeds the drafter's own previous output o with the true token
        x_{a+j} (EAGLE-3's TTT: own hidden states, data tokens) at position a−1+j and sees the pairs up to
        a−1 plus its own chain. Step j's logits predict x_{a+1+j} (= labels[..., j]). Anchors ≤ 0 (no
        pair before them, or padding) produce finite values that the loss must mask.
        taps [B, T, n_taps·d], input_ids [B, T] int64, anchor_pos [B, A] int64.
        """
        return ttt_forward(self, taps, input_ids, anchor_pos, steps)

    # --- target, construction, checkpoints -------------------------------------------------------
    def attach_target(self, target: Any) -> "Eagle3Drafter":
        """Uses `target`'s frozen embedding (held by reference, never stored)."""
        self.check_target(target)
        parts = TargetTables.from_target(target)
        self._tables = parts
        return self

    @classmethod
    def for_target(cls, target: Any, *, draft_ids: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                   **overrides: Any) -> "Eagle3Drafter":
        """A new drafter shaped like `target`'s layers, taps `eagle3_layer_ids(L)`. `draft_ids`: the draft
        vocabulary (e.g. `train.eagle3.build_draft_vocab`), default all ids. The LM head starts as the
        target's head rows of the draft vocabulary (our choice: a better start than random). Device: the
        target's; dtype: `dtype`, default the target embedding's."""
        model = hf_causal_lm(target)
        parts = TargetTables.from_target(model)
        shape = target_shape(model.config)
        del shape["num_target_layers"]
        n_layers = model.config.num_hidden_layers
        ids = torch.arange(parts.shape[0]) if draft_ids is None else torch.as_tensor(draft_ids)
        config = Eagle3Config(**{**shape, "vocab_size": parts.shape[0], "draft_vocab_size": len(ids),
                                 "target_layer_ids": eagle3_layer_ids(n_layers), "num_target_layers": n_layers,
                                 **overrides})
        drafter = cls(config)
        drafter.set_draft_vocab(ids)
        head = parts.full_head_weight
        if head.shape[1] == config.hidden_size:
            with torch.no_grad():
                drafter.lm_head.weight.copy_(head[ids.to(head.device)].float())
        weight = parts.embedding
        return drafter.to(device=weight.device, dtype=dtype or weight.dtype).attach_target(target)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, target: Any = None, *, dtype: torch.dtype | str | None = None,
                        device: torch.device | str | None = None) -> "Eagle3Drafter":
        """Loads an `LlamaForCausalLMEagle3` (SpecForge / SafeAILab) or `speculators` (vLLM) checkpoint;
        `embed_tokens.weight`, if present, is ignored (the target's embedding is used). Weights keep their
        stored dtype unless `dtype` is given. A `frozen_lm_head` checkpoint takes its head from `target`
        (ValueError without one). Unsupported options: NotImplementedError naming the field."""
        dtype = ckpt.check_load_args(path, dtype, cls.__name__)
        n_target = hf_causal_lm(target).config.num_hidden_layers if target is not None else None
        speculators = formats.is_speculators(ckpt.read_config(path, "eagle3"))
        parse = formats.config_from_speculators if speculators else Eagle3Config.from_hf_dict
        config = ckpt.load_config(path, "eagle3", lambda cfg: parse(cfg, n_target))
        weights = ckpt.read_weights(path, "eagle3")
        if speculators:
            weights = formats.weights_from_speculators(weights)
        weights = {k: v for k, v in weights.items() if k != "embed_tokens.weight" and not k.endswith("inv_freq")}
        if "t2d" not in weights and "d2t" in weights:  # vLLM / SGLang need only d2t
            t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
            t2d[torch.arange(weights["d2t"].numel()) + weights["d2t"]] = True
            weights["t2d"] = t2d
        if config.frozen_lm_head and "lm_head.weight" not in weights:
            if target is None:
                raise ValueError(f"{path}: frozen_lm_head checkpoint: pass the target (its LM head is the head)")
            tables = TargetTables.from_target(target)
            config_fits(cls.__name__, config, tables.shape, "vocab_size", "hidden_size")  # before the gather
            head = tables.full_head_weight
            ids = torch.arange(weights["d2t"].numel()) + weights["d2t"]
            weights["lm_head.weight"] = head[ids.to(head.device)].detach().to("cpu", weights["fc.weight"].dtype)
        return ckpt.build_loaded(cls, config, weights, f"{path} (EAGLE-3 drafter)", target, device, dtype)

    def save_pretrained(self, path: str | os.PathLike, format: str = "flashmap", *, verifier: str | None = None) -> None:
        """Writes config.json + model.safetensors (no `embed_tokens`) in `format`:
        - "flashmap": SpecForge names and config plus our fields; a `frozen_lm_head` head is not stored.
        - "specforge": the same for an engine (SGLang; vLLM reads it too): `lm_head.weight` always stored,
          `frozen_lm_head` dropped from the config.
        - "speculators": vLLM's format (`eagle3/formats.py`); `verifier` names the target there.
        ValueError for another format."""
        state = self.state_dict()
        if format == "flashmap":
            config = {**self.config.to_hf_dict(), "torch_dtype": ckpt.dtype_name(self.fc.weight.dtype)}
            skip = {"lm_head.weight"} if self.config.frozen_lm_head else set()
            ckpt.write_checkpoint(path, config, state, skip=skip)
        elif format == "specforge":
            engine = dataclasses.replace(self.config, frozen_lm_head=False)
            config = {**engine.to_hf_dict(), "torch_dtype": ckpt.dtype_name(self.fc.weight.dtype)}
            ckpt.write_checkpoint(path, config, state)
        elif format == "speculators":
            config = {**formats.speculators_config(self.config, verifier),
                      "torch_dtype": ckpt.dtype_name(self.fc.weight.dtype)}
            ckpt.write_checkpoint(path, config, formats.weights_to_speculators(state))
        else:
            raise ValueError(f"format must be 'flashmap', 'specforge' or 'speculators', got {format!r}")
