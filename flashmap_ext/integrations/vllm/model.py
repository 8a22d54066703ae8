"""The FlashMap drafter as a vLLM model, served through vLLM's DFlash proposer (`method="dflash"`).

vLLM's DFlash path, per decoding step and request: `combine_hidden_states` maps the target's tapped
hidden states of the newly committed positions to memory entries, `precompute_and_store_context_kv`
stores their per-layer K/V at the positions' paged-KV slots, then one forward runs on the query block
[anchor at p, K mask slots at p+1 … p+K]; draft k is the argmax of `compute_logits` of slot k.
FlashMap maps onto it as follows (drafters/flashmap.py):
  - memory entry j = tap_norm(tap_proj(taps_j)), its cross-attention K/V per DiT block stored in the
    drafter's paged KV cache (vLLM allocates it from the config's heads/head_dim; the layout inside a
    layer's cache is ours: slot s holds (k, v) [2, heads, head_dim]);
  - the anchor becomes the last memory entry, the K slots start from the drafter's Philox noise keyed
    by (flashmap_seed, p) instead of mask embeddings, and `draft_block` runs 1 or 2 flow-map
    evaluations (config.draft_steps) inside the forward;
  - the forward returns the drafter's logits (fp32, softcapped, draft rows) in place of hidden states
    and `compute_logits` passes them through (mapped to target ids with a draft vocabulary), so the
    drafts are exactly `draft_block`'s.
The cross-attention of the slots must see memory positions 0 … p only, never the query block's own
slots; vLLM's attention kernels attend the query block to the whole sequence, so the memory is
gathered per request from the block table and attended in PyTorch (the reference path). A fused
prefix-only paged attention is the upstream hook a GPU path would want.

vLLM internals this works around, and the upstream hook each would need (vLLM 0.32):
  1. `SpecDecodeBaseProposer.propose` asserts the draft model is one of vLLM's Eagle3/DFlash classes, hence
     the subclass of `DFlashQwen3ForCausalLM` (its __init__ is not run). Hook: check an interface
     (combine_hidden_states, precompute_and_store_context_kv, compute_logits) instead of a class list.
  2. The drafter forward gets no request identity or seed, so the noise is keyed by the export's
     `flashmap_seed` and the anchor position, not by the request seed (lossless either way; only the
     drafts depend on it). Hook: pass the per-request seeds (SamplingMetadata) to the drafter forward.
  3. No prefix-only attention: the query block's attention always covers its own positions. Hook: a
     per-layer "attend to the context only" flag (seq_len − query length) in the DFlash metadata, which
     would let the slots use the backend's paged kernel instead of the gather + PyTorch attention here.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
from vllm.model_executor.models.utils import maybe_prefix

from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter, FlashMapMemory
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.integrations.vllm.export import plugin_refusal
from flashmap_ext.target.tables import TargetTables


class _PagedMemory(nn.Module):
    """Holds the embedding (shared from the target by vLLM), the drafter and one vLLM Attention layer
    per DiT block; the Attention layers only make vLLM allocate paged KV memory (never called)."""

    def __init__(self, config: FlashMapConfig, vllm_config: VllmConfig, start_layer_id: int, prefix: str):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.d_target,
                                                   prefix=maybe_prefix(prefix, "embed_tokens"))
        self.drafter = FlashMapDrafter(config)
        cache = get_current_vllm_config().cache_config
        self.attn = nn.ModuleList(
            Attention(config.heads, config.head_dim, config.head_dim ** -0.5, num_kv_heads=config.heads,
                      cache_config=cache, prefix=f"{prefix}.layers.{start_layer_id + i}.cross_attn.attn")
            for i in range(config.n_layers))

    def slots_view(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s paged cache viewed as [num_slots, 2, heads, head_dim] (our layout)."""
        c = self.drafter.config
        return self.attn[layer].kv_cache.view(-1).view(-1, 2, c.heads, c.head_dim)


class FlashMapDFlashForCausalLM(DFlashQwen3ForCausalLM):
    """vLLM model of an exported FlashMap drafter (export.export_flashmap)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        spec = vllm_config.speculative_config
        self.draft_model_config = spec.draft_model_config
        self.config = self.draft_model_config.hf_config
        fm = FlashMapConfig.from_dict(dict(self.config.flashmap_config))
        refusal = plugin_refusal(fm)  # export_flashmap refuses these too
        if refusal:
            raise NotImplementedError(f"flashmap_config: {refusal}")
        self.seed = int(getattr(self.config, "flashmap_seed", 0))
        self.draft_id_to_target_id = None
        self.model = _PagedMemory(fm, vllm_config, vllm_config.model_config.get_total_num_hidden_layers(),
                                  maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(fm.vocab_size, fm.d_target, prefix=maybe_prefix(prefix, "lm_head"))
        self._block_size = vllm_config.cache_config.block_size

    @property
    def drafter(self) -> FlashMapDrafter:
        return self.model.drafter

    # --- the DFlash proposer's interface ---------------------------------------------------------------
    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """taps [N, n_taps·d_target] -> memory entries [N, width]."""
        return self.drafter._context_entries(hidden_states[None])[0]

    def precompute_and_store_context_kv(self, context_states: torch.Tensor, context_positions: torch.Tensor,
                                        context_slot_mapping: torch.Tensor | None = None) -> None:
        """Per DiT block, the cross-attention K/V of entries [N, width] at positions [N], written to the
        slots [N] (nothing is written without slots: vLLM's profiling run)."""
        kvs = self.drafter._layer_kvs(context_states[None], context_positions[None].long())
        if context_slot_mapping is None:
            return
        slots = context_slot_mapping.long()
        valid = slots >= 0
        for layer, (k, v) in enumerate(kvs):  # k, v: [1, h, N, hd]
            store = self.model.slots_view(layer)
            store[slots[valid], 0] = k[0].transpose(0, 1)[valid].to(store.dtype)
            store[slots[valid], 1] = v[0].transpose(0, 1)[valid].to(store.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids/positions [R·(1+K)] (request-major query blocks) -> [R·(1+K), V_s] fp32: row 0 of
        each block is zero (the anchor drafts nothing), rows 1…K are the slots' draft logits."""
        k = self.drafter.config.block_size
        out = torch.zeros(input_ids.shape[0], self.drafter.config.state_vocab_size, dtype=torch.float32,
                          device=input_ids.device)
        meta = self._attn_metadata()
        if meta is None:  # profiling / warm-up run: no cache, no requests
            return out
        self._attach_tables()
        starts = meta.query_start_loc.tolist()
        for r in range(len(starts) - 1):
            first, n = starts[r], starts[r + 1] - starts[r]
            if n != 1 + k:
                raise RuntimeError(f"FlashMap drafter: expected query blocks of 1+K={1 + k} tokens, got {n}")
            p = int(positions[first])
            memory = self._gather_memory(meta.block_table[r], p)
            anchor = input_ids[first:first + 1].long()
            block = draft_flashmap(self.drafter, memory, anchor, seed=self.seed, position=p, return_logits=True)
            out[first + 1:first + 1 + k] = block.logits[0]
        return out

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The forward's logits, over the target vocabulary (−inf outside a draft vocabulary)."""
        c = self.drafter.config
        if c.draft_vocab_size is None:
            return hidden_states
        full = hidden_states.new_full((hidden_states.shape[0], c.vocab_size), float("-inf"))
        rows = torch.arange(c.draft_vocab_size, device=hidden_states.device) + self.drafter.d2t
        return full.index_copy_(1, rows, hidden_states)

    def get_draft_kv_cache_layer_names(self) -> list[str]:
        return [a.layer_name for a in self.model.attn]

    def get_draft_attn_causal(self) -> list[bool]:
        return [False] * len(self.model.attn)

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, is_multimodal=None) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Loads the drafter's state dict (names as `FlashMapDrafter.save_pretrained` writes them)."""
        state = dict(weights)
        own = self.drafter.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"FlashMap checkpoint does not match its config: missing {missing[:8]}, "
                             f"unexpected {unexpected[:8]}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor)
        return {f"model.drafter.{name}" for name in state}

    # --- helpers --------------------------------------------------------------------------------------
    def _attn_metadata(self):
        meta = get_forward_context().attn_metadata
        if not meta:
            return None
        if isinstance(meta, list):
            raise NotImplementedError("FlashMap drafter: micro-batched (ubatch) forwards are not supported")
        return meta.get(self.model.attn[0].layer_name)

    def _attach_tables(self) -> None:
        """Reads E and the LM head from the modules vLLM shared from the target (real rows only)."""
        c = self.drafter.config
        emb, head = self.model.embed_tokens.weight, self.lm_head.weight
        if self.drafter._tables is None or self.drafter._tables.embedding.data_ptr() != emb.data_ptr():
            rows = None if c.draft_vocab_size is None else torch.arange(c.draft_vocab_size, device=emb.device) + self.drafter.d2t
            self.drafter.attach_tables(TargetTables(emb[:c.vocab_size], head[:c.vocab_size], None, rows))

    def _gather_memory(self, block_table: torch.Tensor, length: int) -> FlashMapMemory:
        """A batch-1 FlashMapMemory of positions 0 … length−1 read from the paged cache."""
        pos = torch.arange(length, device=block_table.device)
        slots = block_table.long()[pos // self._block_size] * self._block_size + pos % self._block_size
        kv = torch.stack([self.model.slots_view(i)[slots] for i in range(len(self.model.attn))])  # [L, n, 2, h, hd]
        kv = kv.permute(2, 0, 3, 1, 4)[:, :, None]  # [2, L, 1, h, n, hd]
        memory = FlashMapMemory(kv[0].to(self.drafter.dtype).contiguous(), kv[1].to(self.drafter.dtype).contiguous(),
                                length=length)
        memory.reserve(length + 1)  # the anchor's entry
        return memory
