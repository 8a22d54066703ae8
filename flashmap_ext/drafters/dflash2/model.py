"""DFlash2 drafter: DFlash (dflash/model.py) with a dynamic convolution around each sublayer (conv.py) and
a candidate selector over its per-slot logits (selector.py). One forward drafts the block as DFlash's; the
draft chain is then the selector's path through the top-k candidates of each slot (`path`: "greedy", the
reference's slot-by-slot walk, or "best", the Viterbi path of the whole block).
Sources: speculators 0.9 `speculators/models/dflash2/` (the parity reference), z-lab's DFlash2 checkpoints.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from flashmap_ext.drafters.common import checkpoint as ckpt
from flashmap_ext.drafters.common.vocab import IGNORE
from flashmap_ext.drafters.dflash.blocks import attention_rule
from flashmap_ext.drafters.dflash.model import DFlashDrafter, DFlashLayer, DFlashMemory
from flashmap_ext.drafters.dflash2 import speculators_format
from flashmap_ext.drafters.dflash2.config import DFlash2Config
from flashmap_ext.drafters.dflash2.conv import DynamicConv
from flashmap_ext.drafters.dflash2.selector import CandidateSelector

PATHS = ("greedy", "best")


class DFlash2Layer(DFlashLayer):
    """DFlash's layer, each sublayer's normed input and its output passed through a dynamic convolution."""

    def __init__(self, c: DFlash2Config):
        super().__init__(c)
        args = (c.hidden_size, c.block_size, c.conv_kernel_size, c.conv_group_size)
        self.attention_conv, self.mlp_conv = DynamicConv(*args), DynamicConv(*args)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, cos, sin, ctx_k, ctx_v, mask)[0], delta)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


class DFlash2Drafter(DFlashDrafter):
    """DFlash2 drafter (the `BlockDrafter` protocol, as DFlashDrafter). Weights: DFlash's, plus
    `layers.{i}.{attention,mlp}_conv.{base_kernel,kernel_projection.weight}` and
    `candidate_selector.{predecessor_codebook,successor_codebook,hidden_projection.weight}`."""

    layer_type = DFlash2Layer
    kind, label = "dflash2", "DFlash2 drafter"
    config_type = DFlash2Config
    # `--init-from` a DFlash checkpoint (train/warm_start.py): these start as a fresh DFlash2's
    warm_start_base = DFlashDrafter
    warm_start_added = ("_conv.", "candidate_selector.")

    def __init__(self, config: DFlash2Config, target: Any = None, path: str = "greedy"):
        super().__init__(config, target)
        c = config
        for layer in self.layers:  # DFlashDrafter's init drew every Linear: the convolutions start as identities
            layer.attention_conv.reset_parameters(), layer.mlp_conv.reset_parameters()
        self.candidate_selector = CandidateSelector(c.selector_rows, c.hidden_size, c.selector_rank,
                                                    c.selector_top_k, c.initializer_range)
        self.path = path

    @property
    def path(self) -> str:
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        if value not in PATHS:
            raise ValueError(f"path: expected one of {PATHS}, got {value!r}")
        self._path = value

    # --- drafting ----------------------------------------------------------------------------------
    @torch.no_grad()
    def draft_with_logits(self, memory: DFlashMemory, anchor_tokens: torch.Tensor, *, num_tokens: int,
                          seed: torch.Tensor | None = None,
                          position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, num_tokens] int64: the selector's path, logits [B, num_tokens, V_d]: the unary logits
        over the draft vocabulary's rows, in the weights' dtype)."""
        if not 0 <= num_tokens <= self.num_draft_tokens:
            raise ValueError(f"num_tokens must be in [0, {self.num_draft_tokens}], got {num_tokens}")
        hidden = self.block_hidden(memory, anchor_tokens, position)[:, :num_tokens]
        unary = self.vocab_logits(hidden)
        return self.vocab.to_target(self.select(unary, hidden, anchor_tokens)), unary

    def select(self, unary: torch.Tensor, hidden: torch.Tensor, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """Draft rows [B, K] of `self.path` through unary [B, K, V_d], hidden [B, K, d] after anchors [B]."""
        walk = self.candidate_selector.greedy_path if self.path == "greedy" else self.candidate_selector.best_path
        return walk(unary, hidden, self.anchor_rows(anchor_tokens))

    def anchor_rows(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B] draft rows of the anchors (IGNORE outside the draft vocabulary): one comparison with the V_d
        rows, cheaper per round than `DraftVocab.to_draft`'s sort."""
        rows = self.vocab.target_ids
        if rows is None:
            return anchor_tokens
        hit = rows.to(anchor_tokens.device)[None, :] == anchor_tokens[:, None]
        return torch.where(hit.any(-1), hit.long().argmax(-1), IGNORE)

    # --- attention -------------------------------------------------------------------------------
    def _layer_masks(self, query_pos: torch.Tensor, key_pos: torch.Tensor, structure: torch.Tensor | None):
        """DFlash's per-layer masks; with `window_from_anchor`, a sliding layer's window counts back from the
        block's anchor: every slot of it reads context positions [anchor − W, anchor)."""
        if not self.config.window_from_anchor:
            return super()._layer_masks(query_pos, key_pos, structure)
        bs = self.config.block_size
        anchor = query_pos - torch.arange(query_pos.shape[1], device=query_pos.device) % bs
        out = []
        for i in range(len(self.layers)):
            causal, window = self.config.layer_attention(i)
            rule = attention_rule(query_pos, key_pos, causal, None)
            if window is not None:
                rule = rule & (key_pos[:, None, :] >= anchor[:, :, None] - window)
            rule = rule[:, None]
            out.append(rule if structure is None else rule & structure)
        return out

    # --- checkpoints -------------------------------------------------------------------------------
    @staticmethod
    def parse_config(cfg: dict) -> DFlash2Config:
        return speculators_format.parse(cfg)

    def save_pretrained(self, path: str | os.PathLike, layout: str = "zlab", verifier: str | None = None) -> None:
        """Writes config.json + model.safetensors (no embedding / LM head) in z-lab's layout ("zlab") or
        speculators' ("speculators", naming `verifier` as its verifier; NotImplementedError naming the field
        it has no place for)."""
        dtype = ckpt.dtype_name(self.fc.weight.dtype)
        if layout == "speculators":
            config = speculators_format.to_speculators(self.config, dtype, verifier)
        elif layout == "zlab":
            config = {**self.config.to_hf_dict(), "torch_dtype": dtype}
        else:
            raise ValueError(f"layout: expected 'zlab' or 'speculators', got {layout!r}")
        ckpt.write_checkpoint(path, config, self)
