"""The FlashMap drafter (DESIGN.md §5): a small DiT that maps d-space noise to a block of K draft tokens
with a flow map in 1 or 2 evaluations, conditioned on the target's hidden states, and `draft_block`.

Memory entries are the projected target taps of committed positions plus, last, the anchor's embedding
(the anchor's own hidden state does not exist yet). Slots read the flow state through the frozen
embedding (`Eᵀx`, d-space, DESIGN.md §4). Cross-attention uses RoPE on absolute positions (memory entry j
at j, the anchor at its position p, slot k at p + 1 + k) so the drafter knows which context is recent.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from flashmap_ext.checks import check_int
from flashmap_ext.drafters.common import checkpoint as ckpt
from flashmap_ext.drafters.common.base import ReadsTarget, check_memory_ids, check_memory_type, own_memory
from flashmap_ext.drafters.common.layers import RMSNorm
from flashmap_ext.drafters.common.vocab import DraftVocab
from flashmap_ext.drafters.common.window import window_start
from flashmap_ext.drafters.flashmap import fused
from flashmap_ext.drafters.flashmap.block import DiTBlock, FinalLayer, TimestepEmbedder
from flashmap_ext.drafters.flashmap.config import FlashMapConfig, default_tap_layers, shape_fields
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.drafters.flashmap.flow import (
    d_space_noise,
    noise_factor,
    projected_clock_table,
    reader_log_likelihood,
    whitened_rows,
)
from flashmap_ext.drafters.flashmap.memory import KV, FlashMapMemory, TrainMemory, ragged_mask
from flashmap_ext.drafters.flashmap.mode import draft_best_of
from flashmap_ext.drafters.flashmap.qwen_block import NormHead, QwenBlock
from flashmap_ext.rng import drafter_xi
from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.tables import TargetTables
from flashmap_ext.weights_file import save_weights

# Slot-position init std: the slot token is RMSNorm(Linear(Eᵀx)) (unit RMS) + slot_pos. At τ = 0 that state is
# pure noise, so at the usual 0.02 the slot's identity would be ~3 % of its token and learn slowly.
SLOT_POS_STD = 1.0


def _drop_packed_after_load(module: "FlashMapDrafter", _incompatible_keys) -> None:
    """load_state_dict post hook (a module-level function, so the drafter still pickles)."""
    module.drop_packed()


def per_tap_rms_norm(taps: torch.Tensor, n_taps: int, eps: float) -> torch.Tensor:
    """taps [..., n_taps·d] (any float dtype) -> [..., n_taps·d] fp32: each tap's d-vector x divided by its
    RMS, x / sqrt(mean(x²) + eps), computed in fp32 (`FlashMapConfig.tap_input_norm`; no gain)."""
    x = taps.float().unflatten(-1, (n_taps, -1))
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)).flatten(-2)


class FlashMapDrafter(ReadsTarget, nn.Module):
    """FlashMap DiT drafter; implements the BlockDrafter protocol (drafters/common/base.py).

    Trainable: tap projection + RMSNorm (with `config.tap_input_norm`, each tap is RMS-normalised first,
    no weights), anchor projection + RMSNorm (both to `config.memory_entry_width`), slot input projection + RMSNorm +
    slot-position embedding, one or two time embedders, n_layers adaLN-Zero blocks, the final adaLN and
    Linear(w -> d_target) (and with `config.head_mlp` a residual MLP at d_target); with `config.trunk` "qwen3",
    n_layers DFlash-style layers, `time_in` and a final RMSNorm instead of the blocks and the final layer. Frozen and not owned: the target's embedding and LM head (`attach_target`).
    """

    # `--add-layers` (train/warm_start.py): the stack a deeper drafter extends, and its layer-count field
    layer_prefix, depth_fields = "blocks.", ("n_layers",)
    memory_type = FlashMapMemory  # what new_memory makes (draft_block refuses another drafter's)
    target_fields, checks_tap_layers = ("vocab_size", "d_target"), False  # ReadsTarget.check_target

    def __init__(self, config: FlashMapConfig, target: Any = None):
        super().__init__()
        c, w = config, config.width
        self.config = c
        norm = functools.partial(RMSNorm, eps=c.norm_eps, scale_in_fp32=True)  # as the fused kernels
        mw = c.memory_entry_width
        self.tap_proj, self.tap_norm = nn.Linear(len(c.target_layer_ids) * c.d_target, mw), norm(mw)
        self.anchor_proj, self.anchor_norm = nn.Linear(c.d_target, mw), norm(mw)
        self.slot_proj, self.slot_norm = nn.Linear(c.d_target, w), norm(w)
        self.slot_pos = nn.Parameter(torch.empty(c.block_size, w))
        self.s_embedder = TimestepEmbedder(c.cond_dim, c.time_scale)
        self.t_embedder = TimestepEmbedder(c.cond_dim, c.time_scale) if c.two_time else None
        self.time_in = None  # the qwen3 trunk's conditioning: Linear(cond_dim -> w) added to every slot token
        if c.trunk == "qwen3":
            self.blocks = nn.ModuleList(QwenBlock(w, c.heads, c.memory_heads, c.mlp_hidden, c.norm_eps, c.rope_theta)
                                        for _ in range(c.n_layers))
            self.time_in, self.final = nn.Linear(c.cond_dim, w), NormHead(w, c.norm_eps)
        else:
            self.blocks = nn.ModuleList(DiTBlock(w, c.heads, c.mlp_ratio, c.cond_dim, c.norm_eps, c.rope_theta,
                                                 joint=c.joint_attention, memory_width=mw) for _ in range(c.n_layers))
            self.final = FinalLayer(w, c.cond_dim, c.d_target, c.norm_eps, c.head_mlp)
        if c.draft_vocab_size is not None:  # EAGLE-3 convention: target id = draft id + d2t[draft id]
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self._set_clock()
        self._packed = None  # weights packed for the fused CUDA kernels (see fused_weights)
        self.allow_fused = True  # False forces the reference (PyTorch) path on CUDA, e.g. as a baseline
        self.allow_graphs = True  # False runs the fused CUDA path eagerly (also FLASHMAP_CUDA_GRAPHS=0)
        self.reset_parameters()
        # Loaded weights replace the parameters' values in place: the concatenated packed copies go stale.
        self.register_load_state_dict_post_hook(_drop_packed_after_load)
        if target is not None:
            self.attach_target(target)

    def _set_clock(self) -> None:
        #: the τ↔t clock (flow.Clock; `clock.name` says which: "full-state" or "projected")
        self.clock = self.config.clock
        #: t at τ = ½ (the 2-step midpoint), a Python float so compiled graphs see a constant
        self.t_mid = float(self.clock.t_of_tau(0.5))

    def calibrate_clock(self, samples: int = 2048, seed: int = 0) -> "FlashMapDrafter":
        """Builds the "projected" clock from the attached state embedding (flow.projected_clock_table) and
        stores it in `config.clock_t` / `clock_tau` (so checkpoints carry it); returns self."""
        t, tau = projected_clock_table(self.tables.state_embedding, samples, seed)
        self.config.clock_t, self.config.clock_tau = tuple(t), tuple(tau)
        self._set_clock()
        return self

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_target(cls, target: Any, preset: str | None = None, *, init: str = "zero",
                   **fields: Any) -> "FlashMapDrafter":
        """A fresh drafter for `target` (HF causal LM or adapter) on the target's device.

        preset: a size from `config.SHAPES` ("qwen3-8b": 6 layers, width 2048, K 16, ≈0.5 B parameters at
            d_target 4096; "cpu-small"; "cpu-tiny"), or None to give all of n_layers, width, heads in
            `fields` (nothing is guessed: ValueError naming `preset` otherwise).
        init: "zero" (adaLN-Zero: every block starts as the identity, the logits at 0, so an untrained
            drafter proposes one id everywhere; the start of training) or "random" (random gates, so
            every input matters: experiments and plumbing runs, as `--drafter random`).
        fields: any FlashMapConfig field. d_target, vocab_size and 5 tap layers spread from 1 to L−3 come
            from the target unless given; TargetMismatch (a ValueError) for target_layer_ids the target lacks.
        """
        if init not in ("zero", "random"):
            raise ValueError(f"init: expected 'zero' or 'random', got {init!r}")
        model = hf_causal_lm(target)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        emb = model.get_input_embeddings().weight
        shape = dict(d_target=emb.shape[1], vocab_size=emb.shape[0],
                     target_layer_ids=default_tap_layers(cfg.num_hidden_layers))
        drafter = cls(FlashMapConfig(**{**shape, **shape_fields(preset, fields)}))
        drafter.check_tap_layers(target)
        if init == "random":
            drafter.reset_parameters(zero_init=False)
        return drafter.to(emb.device).attach_target(target)

    def reset_parameters(self, zero_init: bool = True) -> None:
        """DiT init: xavier-uniform Linear weights, zero biases, N(0, 0.02) time MLP, N(0, 1) slot positions (the
        scale of the RMS-normalised slot state they are added to; DESIGN.md §5.1).
        zero_init (adaLN-Zero): zero every adaLN Linear and the output Linear, so each block starts as the
        identity and the logits start at 0. zero_init=False leaves them random (tests, random drafters)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for emb in (self.s_embedder, self.t_embedder):
            if emb is not None:
                for lin in (emb.mlp[0], emb.mlp[2]):
                    nn.init.normal_(lin.weight, std=0.02)
        nn.init.normal_(self.slot_pos, std=SLOT_POS_STD)
        if self.time_in is not None:  # qwen3 trunk: random layers (as DFlash), the τ conditioning starts at 0
            gates = [self.time_in]
        else:
            gates = [b.adaLN for b in self.blocks] + [self.final.adaLN, self.final.out]
        if self.time_in is None and self.final.head_mlp is not None:  # the head MLP's output Linear: adds nothing
            gates.append(self.final.head_mlp[2])
        for lin in gates:
            if zero_init:
                nn.init.zeros_(lin.weight)
            else:
                nn.init.normal_(lin.weight, std=lin.in_features ** -0.5)  # O(1) gates: every input matters
            nn.init.zeros_(lin.bias)

    @staticmethod
    def identity_layer_init(block: nn.Module) -> None:
        """Makes `block` pass its input on: adaLN-Zero (a DiT block) zeroes the modulation Linear, so its gated
        residuals add nothing; a qwen3 block zeroes its residual outputs."""
        if isinstance(block, QwenBlock):
            return block.identity_init()
        nn.init.zeros_(block.adaLN.weight), nn.init.zeros_(block.adaLN.bias)

    def attach_target(self, target: Any) -> "FlashMapDrafter":
        """References the target's embedding and LM head (never copied into this module's state)."""
        self.check_target(target)
        return self.attach_tables(TargetTables.from_target(target, self.vocab.target_ids))

    def attach_tables(self, tables: TargetTables) -> "FlashMapDrafter":
        self.check_fits(tables.shape, *self.target_fields)
        self._tables = tables
        self.drop_packed()  # the pack holds the LM head rows of the tables
        return self

    def set_draft_vocab(self, token_ids: torch.Tensor, target: Any) -> None:
        """Sets the draft vocabulary: token_ids [draft_vocab_size] int64, distinct target ids."""
        self.d2t.copy_(DraftVocab.offsets(token_ids, self.config.draft_vocab_size))
        self.attach_target(target)

    @property
    def noise_factor(self) -> torch.Tensor:
        """L [d, d] fp32 with LLᵀ = E_sᵀE_s, on E's device, computed once per tables (flow.noise_factor)."""
        return self.tables.memo("noise_factor", lambda: noise_factor(self.tables.state_embedding).to(torch.float32))

    @property
    def num_draft_tokens(self) -> int:
        return self.config.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    @property
    def dtype(self) -> torch.dtype:
        return self.slot_pos.dtype

    # ------------------------------------------------------------------ token/state helpers
    def to_state_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> rows of the flow's vocabulary; −100 stays −100, ids outside the draft vocab -> −100."""
        return self.vocab.to_draft(token_ids)

    def to_target_ids(self, state_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the flow's vocabulary -> target token ids."""
        return self.vocab.to_target(state_ids)

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """E[token_ids] (target ids) -> [..., d_target] fp32 (the data end of the d-space interpolant)."""
        return F.embedding(token_ids, self.tables.embedding).float()

    def probs_to_state(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [..., V_s] -> probs @ E_s [..., d_target] fp32 (a V-space state seen through Eᵀ)."""
        e = self.tables.state_embedding
        return (probs.to(e.dtype) @ e).float()

    def noise_from_xi(self, xi: torch.Tensor) -> torch.Tensor:
        """xi [..., d_target] standard normal -> z ~ N(0, E_sᵀE_s), fp32 (DESIGN.md §4 d-space noise)."""
        return d_space_noise(self.noise_factor, xi.float())

    def sample_noise(self, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """z [B, K, d_target] fp32 from the drafter's own Philox stream keyed by (seed[b], position[b]),
        [B] int64; drawn on the embedding's device (no host sync when seed and position live there)."""
        device = self.tables.embedding.device
        xi = drafter_xi(seed.to(device), position.to(device), (self.config.block_size, self.config.d_target))
        return self.noise_from_xi(xi)

    def state_log_likelihood(self, slot_inputs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """log p(Eᵀx = slot_inputs | y = v) + const: slot_inputs [..., K, d_target] d-space states, t [...]
        their interpolant time (< 1) -> [..., K, V_s] fp32 (flow.reader_log_likelihood in whitened
        coordinates; `config.state_loglik` adds it to the logits)."""
        inv = self.tables.memo("noise_factor_pinv", lambda: torch.linalg.pinv(self.noise_factor.double()).float())
        rows = self.tables.memo("whitened_rows", lambda: whitened_rows(self.tables.state_embedding).float())
        return reader_log_likelihood(slot_inputs.float() @ inv.T, rows, t.float()[..., None])

    def state_term(self, slot_inputs: torch.Tensor, tau_s: torch.Tensor) -> torch.Tensor | None:
        """`state_log_likelihood` at t(τ_s) when `config.state_loglik`, else None; tau_s [...] matches
        slot_inputs.shape[:-2]."""
        if not self.config.state_loglik:
            return None
        return self.state_log_likelihood(slot_inputs, self.clock.t_of_tau(tau_s.double()))

    # ------------------------------------------------------------------ network pieces
    def _context_entries(self, taps: torch.Tensor) -> torch.Tensor:
        n = len(self.config.target_layer_ids) * self.config.d_target
        if taps.dim() != 3 or taps.shape[-1] != n:
            raise ValueError(f"taps: expected [B, T, {n}] (n_taps·d_target), got {list(taps.shape)}")
        if self.config.tap_input_norm:
            taps = per_tap_rms_norm(taps, len(self.config.target_layer_ids), self.config.norm_eps)
        return self.tap_norm(self.tap_proj(taps.to(self.dtype)))

    def _anchor_entries(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.anchor_norm(self.anchor_proj(self.embed_tokens(token_ids).to(self.dtype)))

    def _layer_kvs(self, entries: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        return [blk.memory_kv(entries, positions) for blk in self.blocks]

    def _cond(self, tau_s: torch.Tensor, tau_t: torch.Tensor) -> torch.Tensor:
        """c = SiLU(Emb_s(τ_s) + Emb_t(τ_t)) (FMLM); a flow model (two_time=False) ignores τ_t."""
        h = self.s_embedder(tau_s)
        if self.t_embedder is not None:
            h = h + self.t_embedder(tau_t)
        return F.silu(h)

    def _trunk(self, slot_inputs: torch.Tensor, tau_s: torch.Tensor, c: torch.Tensor, kv: Callable[[int], KV],
               q_pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """slot_inputs [B, A, K, d_target], tau_s [B, A], c [B, A, cond_dim] -> hidden [B, A, K, d_target]
        (pre-head). With `config.tau_gated_input` the state's part of a slot token is scaled by τ_s."""
        x = self.slot_norm(self.slot_proj(slot_inputs.to(self.dtype)))
        if self.config.tau_gated_input:
            x = x * tau_s.to(x.dtype)[..., None, None]
        x = x + self.slot_pos
        if self.time_in is not None:
            x = x + self.time_in(c)[:, :, None]
        for i, block in enumerate(self.blocks):
            x = block(x, c, kv(i), q_pos, mask)
        return self.final(x, c)

    def logits_from_hidden(self, hidden: torch.Tensor, state_term: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [..., d_target] -> logits [..., V_s] fp32: frozen LM head (draft rows), then the tanh
        softcap `cap·tanh(logits/cap)` (FMLM `_process_model_output`) when config.softcap > 0, plus
        `state_term` [..., V_s] (`state_term`: the state's log-likelihood) when given."""
        logits = self.tables.logits(hidden).float()
        cap = self.config.softcap
        logits = cap * torch.tanh(logits / cap) if cap > 0 else logits
        return logits if state_term is None else logits + state_term

    # ------------------------------------------------------------------ inference (BlockDrafter)
    def fused_weights(self):
        """Weights packed for the fused CUDA kernels (DESIGN.md §10, fused.py), or None
        when the fused path does not apply: CPU weights, training mode, `allow_fused = False`, or shapes the kernels do not take
        (`fused_supported`). Packed lazily once; `train()`/`eval()`, `load_state_dict` and `.to()`/`.cuda()`
        drop the pack (`drop_packed`), so changed weights are never served from stale copies. Weights
        changed in place by other means (an optimizer step outside training mode): call `drop_packed()`."""
        if self.training or not self.allow_fused or not fused.fused_supported(self):
            return None
        if self._packed is None:
            self._packed = fused.pack_weights(self)
        return self._packed

    def drop_packed(self) -> None:
        """Forgets the packed fused-kernel weights; the next `fused_weights()` packs the current ones."""
        self._packed = None

    def train(self, mode: bool = True) -> "FlashMapDrafter":
        self.drop_packed()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):  # .to(), .cuda(), .bfloat16(), ...: new tensors, stale pack
        self.drop_packed()
        return super()._apply(fn, *args, **kwargs)

    def new_memory(self, batch_size: int, device: torch.device | str | None = None) -> FlashMapMemory:
        check_int(f"{type(self).__name__}.new_memory: batch_size", batch_size, 1)
        c = self.config
        device = self.slot_pos.device if device is None else device
        return own_memory(self, FlashMapMemory.empty(c.n_layers, batch_size, c.memory_heads, c.head_dim,
                                                     torch.device(device), self.dtype))

    @torch.no_grad()
    def extend_memory(self, memory: FlashMapMemory, token_ids: torch.Tensor, taps: torch.Tensor | None) -> None:
        """Appends committed positions: token_ids [B, T] int64, taps [B, T, n_taps·d_target]. ValueError /
        TypeError naming `token_ids` unless they are integer ids of the target's vocabulary."""
        check_memory_type(self, memory)
        check_memory_ids(token_ids, self.config.vocab_size)
        if taps is None:
            raise ValueError("taps: the FlashMap drafter needs the target's tapped hidden states")
        if token_ids.dim() != 2 or token_ids.shape[0] != memory.batch_size:
            raise ValueError(f"token_ids: expected [B={memory.batch_size}, T], got {list(token_ids.shape)}")
        if taps.shape[:2] != token_ids.shape:
            raise ValueError(f"taps: leading dims {list(taps.shape[:2])} must equal token_ids {list(token_ids.shape)}")
        packed = self.fused_weights() if taps.is_cuda else None
        if packed is not None:
            return fused.fused_extend_memory(packed, memory, token_ids, taps)
        entries = self._context_entries(taps)
        starts = memory.rows  # row b's T positions start at its own length (a ragged batch)
        pos = torch.tensor(starts, device=entries.device)[:, None] + torch.arange(token_ids.shape[1],
                                                                                  device=entries.device)
        memory.write(starts, self._layer_kvs(entries, pos))
        memory.grow(token_ids.shape[1])

    def memory_writer(self, device: torch.device):
        """The counted memory write for CUDA-graphed bookkeeping (round_commit.py): `fn(memory, token_ids, taps,
        start, count)` = fused.fused_write_memory over the packed weights (device offsets and counts, no host
        read), or None where the fused kernels do not run (a CPU, a shape they refuse): extend_memory then."""
        packed = self.fused_weights() if torch.device(device).type == "cuda" else None
        return None if packed is None else functools.partial(fused.fused_write_memory, packed)

    def denoise(self, memory: FlashMapMemory, anchor_tokens: torch.Tensor, slot_inputs: torch.Tensor,
                tau_s: torch.Tensor | float, tau_t: torch.Tensor | float) -> torch.Tensor:
        """One network evaluation at inference: logits [B, K, V_s] fp32 of δ_{s,t} for d-space slot
        states slot_inputs [B, K, d_target]; row b's anchor [B] sits after its lengths[b] committed
        entries, of which the last `config.context_window` (all: None) are read."""
        B, K, n, dev = anchor_tokens.shape[0], self.config.block_size, memory.length, anchor_tokens.device
        lengths = torch.tensor(memory.rows, device=dev)
        anchor = self._anchor_entries(anchor_tokens)[:, None]
        memory.write(memory.rows, self._layer_kvs(anchor, lengths[:, None]))
        tau_s, tau_t = (torch.as_tensor(x, dtype=torch.float32, device=dev).expand(B) for x in (tau_s, tau_t))
        c = self._cond(tau_s, tau_t)[:, None]
        q_pos = lengths[:, None] + 1 + torch.arange(K, device=dev)
        start = window_start(min(memory.rows), self.config.context_window)
        mask = ragged_mask(memory.lengths, start, self.config.context_window, K) if memory.ragged else None
        hidden = self._trunk(slot_inputs[:, None], tau_s[:, None], c, lambda i: memory.layer_kv(i, n + 1, start),
                             q_pos, None if mask is None else mask.to(dev))
        return self.logits_from_hidden(hidden[:, 0], self.state_term(slot_inputs, tau_s))

    def draws_differ(self, steps: int | None = None) -> bool:
        """False when every noise draw drafts the same block (`tau_gated_input` at 1 step, default
        `config.draft_steps`): several draws, or a multi-noise tree, would only repeat it."""
        return not (self.config.tau_gated_input and (steps or self.config.draft_steps) == 1)

    def draft(self, memory: FlashMapMemory, anchor_tokens: torch.Tensor, *, num_tokens: int,
              seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """BlockDrafter.draft: tokens [B, num_tokens] int64 with `config.draft_steps` evaluations per noise draw
        (`config.draft_draws` draws, the best kept: mode.py)."""
        if not (0 <= num_tokens <= self.num_draft_tokens):
            raise ValueError(f"num_tokens: must be in [0, {self.num_draft_tokens}], got {num_tokens}")
        if self.config.draft_draws > 1:
            return draft_best_of(self, memory, anchor_tokens, draws=self.config.draft_draws, seed=seed,
                                 position=position)[:, :num_tokens]
        return draft_flashmap(self, memory, anchor_tokens, seed=seed, position=position).tokens[:, :num_tokens]

    # ------------------------------------------------------------------ training
    def encode_train_memory(self, taps: torch.Tensor, input_ids: torch.Tensor,
                            anchor_pos: torch.Tensor) -> TrainMemory:
        """Memory of whole sequences: taps [B, T, n_taps·d_target], input_ids [B, T], anchor_pos [B, A]
        (−1 = padded block: it sees only input_ids[:, 0] and its output is meaningless)."""
        entries = self._context_entries(taps)
        B, T = entries.shape[:2]
        if tuple(input_ids.shape) != (B, T):
            raise ValueError(f"input_ids: expected [{B}, {T}], got {list(input_ids.shape)}")
        if anchor_pos.dim() != 2 or anchor_pos.shape[0] != B or anchor_pos.dtype != torch.int64:
            raise ValueError(f"anchor_pos: expected [B={B}, A] int64, got {list(anchor_pos.shape)} {anchor_pos.dtype}")
        anchor_pos = anchor_pos.clamp_min(0)
        anchors = self._anchor_entries(input_ids.gather(1, anchor_pos))
        pos = torch.arange(T, device=entries.device).expand(B, T)
        return TrainMemory(self._layer_kvs(entries, pos), self._layer_kvs(anchors, anchor_pos), anchor_pos)

    def denoise_train(self, memory: TrainMemory, slot_inputs: torch.Tensor, tau_s: torch.Tensor,
                      tau_t: torch.Tensor) -> torch.Tensor:
        """slot_inputs [B, A, K, d_target], tau_s/tau_t [B, A] -> hidden [B, A, K, d_target] (pre-head)."""
        B, A = memory.anchor_pos.shape
        K, d = self.config.block_size, self.config.d_target
        if tuple(slot_inputs.shape) != (B, A, K, d):
            raise ValueError(f"slot_inputs: expected [{B}, {A}, {K}, {d}], got {list(slot_inputs.shape)}")
        if tuple(tau_s.shape) != (B, A) or tuple(tau_t.shape) != (B, A):
            raise ValueError(f"tau_s/tau_t: expected [{B}, {A}], got {list(tau_s.shape)} / {list(tau_t.shape)}")
        q_pos = (memory.anchor_pos[:, :, None] + 1 + torch.arange(K, device=slot_inputs.device)).reshape(B, A * K)
        mask = memory.mask(K, self.config.context_window)
        return self._trunk(slot_inputs, tau_s, self._cond(tau_s, tau_t), memory.layer_kv, q_pos, mask)

    def forward_train(self, taps: torch.Tensor, input_ids: torch.Tensor, anchor_pos: torch.Tensor,
                      slot_inputs: torch.Tensor, tau_s: torch.Tensor, tau_t: torch.Tensor, *,
                      return_hidden: bool = False) -> torch.Tensor:
        """All blocks of a batch at once (this is also `forward`, so DDP/FSDP wrappers see it).

        taps [B, T, n_taps·d_target] (any float dtype), input_ids [B, T] int64, anchor_pos [B, A] int64,
        slot_inputs [B, A, K, d_target] d-space states, tau_s/tau_t [B, A] clocks in [0, 1].
        Block (b, a) sees the taps at positions < anchor_pos[b, a] and the embedding of
        input_ids[b, anchor_pos[b, a]], nothing later. Returns logits [B, A, K, V_s] fp32 (with
        `config.state_loglik`, the state term included), or with
        return_hidden the pre-head hidden [B, A, K, d_target] (losses apply `logits_from_hidden` in
        chunks so [B, A, K, V] never exists at once).
        """
        memory = self.encode_train_memory(taps, input_ids, anchor_pos)
        hidden = self.denoise_train(memory, slot_inputs, tau_s, tau_t)
        return hidden if return_hidden else self.logits_from_hidden(hidden, self.state_term(slot_inputs, tau_s))

    forward = forward_train

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, path: str | Path) -> None:
        """Writes config.json + model.safetensors (trainable weights and d2t only; no target tensors)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.config.save(path / "config.json")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_weights(state, path / "model.safetensors", metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, path: str | Path, target: Any, *, dtype: torch.dtype | str | None = None) -> "FlashMapDrafter":
        """Loads a `save_pretrained` directory onto the target's device and attaches the target's
        embedding and LM head. dtype: cast the weights (default: as stored). A missing, malformed or
        truncated checkpoint raises common.checkpoint.CheckpointError (one line naming the file)."""
        dtype = ckpt.check_load_args(path, dtype, cls.__name__)
        config = ckpt.load_config(path, "flashmap", FlashMapConfig.from_dict)
        weights = ckpt.read_weights(path, "flashmap")
        device = hf_causal_lm(target).get_input_embeddings().weight.device
        with torch.device("meta"):
            drafter = cls(config)
        ckpt.load_strict(drafter, weights, f"{path} (FlashMap drafter)")
        drafter.to(device)
        if dtype is not None:
            drafter.to(dtype)
        return drafter.attach_target(target)
