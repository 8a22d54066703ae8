"""Fused fast path of the FlashMap drafter (DESIGN.md §5, §10): the same network as
`FlashMapDrafter.denoise` / `extend_memory`, run through the `flashmap_ext.ops.dit` kernels.

    packed = pack_weights(drafter)                       # once, at load time (if fused_supported(drafter))
    fused_extend_memory(packed, memory, token_ids, taps)  # replaces drafter.extend_memory
    fused_write_memory(packed, memory, token_ids, taps, start, count)  # its device half (device count)
    block = fused_draft_block(packed, memory, anchor_tokens, noise=z, steps=1)   # replaces draft_flashmap
    block = fused_draft_block(packed, memory, anchor_tokens, seed=s, position=p, graph=True)  # CUDA-graph replay
    graph = FusedDraftGraph(packed, memory, batch_size=B, steps=1)  # the graph itself (what graph=True caches)
    tokens = graph(memory, anchor_tokens, z)

Every op also runs on CPU, so this path is tested against the reference drafter on CPU; on CUDA the
weights and the memory must be bf16. The layout and the CUDA graphs: DESIGN.md §5.5, §10.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from flashmap_ext.drafters.common.window import window_start
from flashmap_ext.drafters.flashmap.flow import flow_map_jump
from flashmap_ext.drafters.flashmap.memory import DraftBlock, FlashMapMemory, per_row
from flashmap_ext.ops import dit as ops
from flashmap_ext.ops import dit_fused as fops


@dataclass
class PackedLayer:
    qkv_w: torch.Tensor; qkv_b: torch.Tensor; self_qn: torch.Tensor; self_kn: torch.Tensor
    self_out_w: torch.Tensor; self_out_b: torch.Tensor
    q_w: torch.Tensor; q_b: torch.Tensor; cross_qn: torch.Tensor; cross_kn: torch.Tensor
    cross_out_w: torch.Tensor; cross_out_b: torch.Tensor
    fc1_w: torch.Tensor; fc1_b: torch.Tensor; fc2_w: torch.Tensor; fc2_b: torch.Tensor


@dataclass
class PackedFlashMap:
    """The drafter's weights in the kernels' layout (contiguous [out, in], K-major), built once."""
    drafter: nn.Module  # the FlashMapDrafter: for the time embedders, the noise, the embedding and d2t
    layers: list[PackedLayer]
    adaln_w: torch.Tensor     # [n_layers·9w + 2w, cond_dim]: every block's adaLN, then the final one
    adaln_b: torch.Tensor
    mem_kv_w: torch.Tensor    # [n_layers·2w, w]: per layer k_proj then v_proj
    mem_kv_b: torch.Tensor
    tap_w: torch.Tensor; tap_b: torch.Tensor; tap_norm: torch.Tensor
    tap_in_norm: Optional[torch.Tensor]  # [d_target] ones: the per-tap RMSNorm (config.tap_input_norm), or None
    anchor_w: torch.Tensor; anchor_b: torch.Tensor; anchor_norm: torch.Tensor
    slot_w: torch.Tensor; slot_b: torch.Tensor; slot_norm: torch.Tensor; slot_pos: torch.Tensor
    final_w: torch.Tensor; final_b: torch.Tensor
    head_w: torch.Tensor; head_b: Optional[torch.Tensor]
    # (τs, τt) -> [1, n_layers·9 + 2, w]: the adaLN modulations of the step's constant times, computed once
    # (FLASHMAP_DIT_PRECOMPUTED_MODS=1 or pack_weights(precompute=True)); None = computed every evaluation
    mods: Optional[dict] = None
    # FLASHMAP_DIT_FUSED_NORMS=1 (or pack_weights(fused_norms=True)): the norms run inside the linears
    # (ops.dit_fused); mem_kn [n_layers, head_dim] stacks the memory-key norms for the fused cache append
    fused_norms: bool = False
    mem_kn: Optional[torch.Tensor] = None


def fused_supported(drafter: nn.Module) -> bool:
    """True when the CUDA kernels accept this drafter: bf16 weights on a GPU, every GEMM input width a
    multiple of 64 (d_target, width, cond_dim, MLP hidden) and head dim 64 or 128, no `state_loglik`
    term (the kernels' LM head does not add it), no `joint_attention` (the kernels run the split
    block), no `tau_gated_input` (their slot input is not gated), memory entries as wide as the trunk
    (`memory_width` None or width), no `head_mlp` (their final layer ends at the Linear) and the DiT trunk
    (`trunk` "dit"): other drafters
    take the reference path. (On CPU every shape works.)"""
    c = drafter.config
    if (c.state_loglik or c.joint_attention or c.tau_gated_input or c.memory_entry_width != c.width or c.head_mlp
            or c.trunk != "dit"):
        return False
    widths = (c.d_target, c.width, c.cond_dim, int(c.width * c.mlp_ratio))
    return (drafter.slot_pos.is_cuda and drafter.dtype == torch.bfloat16 and c.head_dim in (64, 128)
            and all(w % 64 == 0 for w in widths))


#: the (τs, τt) pairs of the draft step's evaluations: one step (0 → 1), two steps (0 → ½, ½ → 1)
STEP_TIMES = ((0.0, 1.0), (0.0, 0.5), (0.5, 1.0))


def fused_norms_enabled() -> bool:
    """FLASHMAP_DIT_FUSED_NORMS=1: pack_weights selects the fused norm ops (off by default)."""
    return os.environ.get("FLASHMAP_DIT_FUSED_NORMS", "0") == "1"


def precomputed_mods_enabled() -> bool:
    """FLASHMAP_DIT_PRECOMPUTED_MODS=1: pack_weights precomputes the modulations (off by default)."""
    return os.environ.get("FLASHMAP_DIT_PRECOMPUTED_MODS", "0") == "1"


@torch.no_grad()
def precompute_mods(drafter: nn.Module, adaln_w: torch.Tensor, adaln_b: torch.Tensor) -> dict:
    """{(τs, τt): [1, n_layers·9 + 2, w]} for STEP_TIMES: the adaLN linear of the time condition (which
    depends on nothing else), in float64 and rounded once to the weights' dtype."""
    c, out = drafter.config, {}
    for tau_s, tau_t in STEP_TIMES:
        tau = lambda v: torch.full((1,), v, dtype=torch.float32, device=adaln_w.device)
        cond = drafter._cond(tau(tau_s), tau(tau_t)).double()
        mods = torch.nn.functional.linear(cond, adaln_w.double(), adaln_b.double())
        out[(tau_s, tau_t)] = mods.to(adaln_w.dtype).view(1, 9 * c.n_layers + 2, c.width)
    return out


def pack_weights(drafter: nn.Module, precompute: Optional[bool] = None,
                 fused_norms: Optional[bool] = None) -> PackedFlashMap:
    """The drafter's weights (and the target's LM head rows) in the fused layout. Single weights are
    shared with the module (no copy); the concatenated ones (all adaLN modulations, all memory K/V
    projections) are copies, so pack again after the weights change (training). precompute: the step's
    adaLN modulations per (τs, τt) too (`precompute_mods`; default: FLASHMAP_DIT_PRECOMPUTED_MODS=1).
    fused_norms: run the norms inside the linears (ops.dit_fused; default: FLASHMAP_DIT_FUSED_NORMS=1)."""
    pk = lambda *ts: ts[0].detach().contiguous() if len(ts) == 1 else torch.cat([t.detach() for t in ts])
    layers = [PackedLayer(
        pk(b.self_attn.qkv.weight), pk(b.self_attn.qkv.bias), pk(b.self_attn.q_norm.weight),
        pk(b.self_attn.k_norm.weight), pk(b.self_attn.out.weight), pk(b.self_attn.out.bias),
        pk(b.cross_attn.q_proj.weight), pk(b.cross_attn.q_proj.bias), pk(b.cross_attn.q_norm.weight),
        pk(b.cross_attn.k_norm.weight), pk(b.cross_attn.out.weight), pk(b.cross_attn.out.bias),
        pk(b.mlp[0].weight), pk(b.mlp[0].bias), pk(b.mlp[2].weight), pk(b.mlp[2].bias)) for b in drafter.blocks]
    blocks, fin, tables = drafter.blocks, drafter.final, drafter.tables
    head_b = tables.head_bias
    adaln_w = pk(*[b.adaLN.weight for b in blocks], fin.adaLN.weight)
    adaln_b = pk(*[b.adaLN.bias for b in blocks], fin.adaLN.bias)
    precompute = precomputed_mods_enabled() if precompute is None else precompute
    fused_norms = fused_norms_enabled() if fused_norms is None else fused_norms
    return PackedFlashMap(
        drafter, layers, adaln_w, adaln_b,
        pk(*[w for b in blocks for w in (b.cross_attn.k_proj.weight, b.cross_attn.v_proj.weight)]),
        pk(*[w for b in blocks for w in (b.cross_attn.k_proj.bias, b.cross_attn.v_proj.bias)]),
        pk(drafter.tap_proj.weight), pk(drafter.tap_proj.bias), pk(drafter.tap_norm.weight),
        drafter.tap_proj.weight.new_ones(drafter.config.d_target) if drafter.config.tap_input_norm else None,
        pk(drafter.anchor_proj.weight), pk(drafter.anchor_proj.bias), pk(drafter.anchor_norm.weight),
        pk(drafter.slot_proj.weight), pk(drafter.slot_proj.bias), pk(drafter.slot_norm.weight), pk(drafter.slot_pos),
        pk(fin.out.weight), pk(fin.out.bias),
        tables.head_weight.detach().to(drafter.dtype).contiguous(),
        None if head_b is None else head_b.detach().to(drafter.dtype).contiguous(),
        precompute_mods(drafter, adaln_w, adaln_b) if precompute else None, fused_norms,
        torch.stack([b.cross_attn.k_norm.weight.detach() for b in blocks]) if fused_norms else None)


def _write_entries(p: PackedFlashMap, memory: FlashMapMemory, entries: torch.Tensor, start: torch.Tensor,
                   count: Optional[torch.Tensor] = None) -> None:
    """entries [B, T, w] at positions start[b] + t for t < count[b] (default T): every layer's K (QK-normed,
    rotated) and V, appended in place. start, count [B] int32 on the memory's device."""
    c = p.drafter.config
    B, T, _ = entries.shape
    count = torch.full_like(start, T) if count is None else count
    if p.fused_norms:
        fops.linear_kv_append_(memory.k.transpose(2, 3), memory.v.transpose(2, 3), entries, p.mem_kv_w, p.mem_kv_b,
                               p.mem_kn, start, count, theta=c.rope_theta, eps=c.norm_eps)
        return
    kv = ops.linear(entries, p.mem_kv_w, p.mem_kv_b).view(B, T, c.n_layers, 2, c.heads, c.head_dim)
    pos = (start.long()[:, None] + torch.arange(T, device=start.device)).reshape(-1)
    for i, layer in enumerate(p.layers):
        k = ops.rms_norm(kv[:, :, i, 0], layer.cross_kn, pos.view(B, T), theta=c.rope_theta, eps=c.norm_eps)
        ops.kv_append_(memory.k[i].transpose(1, 2), k, start, count)
        ops.kv_append_(memory.v[i].transpose(1, 2), kv[:, :, i, 1], start, count)


def _tap_entries(p: PackedFlashMap, taps: torch.Tensor) -> torch.Tensor:
    """Memory entries [B, T, w] of the taps [B, T, n_taps·d_target]: tap norm, projection, entry norm."""
    c = p.drafter.config
    B, T = taps.shape[:2]
    taps = taps.to(p.tap_w.dtype)
    if p.tap_in_norm is not None:  # per-tap RMSNorm: [B, T, n_taps, d_target] rows, unit weight
        taps = ops.rms_norm(taps.reshape(B, T, -1, c.d_target), p.tap_in_norm, eps=c.norm_eps).view(B, T, -1)
    entries = ops.linear(taps, p.tap_w, p.tap_b)
    return ops.rms_norm(entries.unsqueeze(-2), p.tap_norm, eps=c.norm_eps).squeeze(-2)


@torch.no_grad()
def fused_extend_memory(p: PackedFlashMap, memory: FlashMapMemory, token_ids: torch.Tensor,
                        taps: torch.Tensor) -> None:
    """FlashMapDrafter.extend_memory on the fused ops: token_ids [B, T], taps [B, T, n_taps·d_target]."""
    memory.reserve(memory.length + token_ids.shape[1])
    entries = _tap_entries(p, taps)
    _write_entries(p, memory, entries, memory.lengths_on(entries.device, torch.int32))  # per-row offsets
    memory.grow(token_ids.shape[1])


@torch.no_grad()
def fused_write_memory(p: PackedFlashMap, memory: FlashMapMemory, token_ids: torch.Tensor, taps: torch.Tensor,
                       start: torch.Tensor, count: torch.Tensor) -> None:
    """The device half of `fused_extend_memory`, with device offsets and counts: row b's first count[b] of the
    T positions (taps [B, T, n_taps·d_target]) written from entry start[b] on (start, count [B] int32 on the
    memory's device; start[b] = row b's length). Reads nothing on the host and neither reserves nor counts:
    the caller reserves start + T entries first and calls `memory.grow(count)` once it knows the count, so a
    CUDA graph can capture it (the chain round's bookkeeping, round_commit.py)."""
    if memory.length + token_ids.shape[1] > memory.capacity:
        raise ValueError(f"memory: {memory.length} + {token_ids.shape[1]} entries exceed its capacity "
                         f"{memory.capacity}: reserve them first")
    _write_entries(p, memory, _tap_entries(p, taps), start, count)


def _self_qkv(p: PackedFlashMap, layer: PackedLayer, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor):
    """The self-attention's q, k (QK-normed) and v [B, K, h, hd] of x [B, K, w]."""
    c = p.drafter.config
    B, K, _ = x.shape
    if p.fused_norms:
        qkv = fops.norm_linear(x, layer.qkv_w, layer.qkv_b, shift=shift, scale=scale, adaln_eps=c.norm_eps,
                               q_norm=layer.self_qn, k_norm=layer.self_kn, heads=c.heads, eps=c.norm_eps)
        return qkv.view(B, K, 3, c.heads, c.head_dim).unbind(2)
    qkv = ops.linear(ops.adaln(x, shift, scale, c.norm_eps), layer.qkv_w, layer.qkv_b).view(B, K, 3, c.heads, c.head_dim)
    q = ops.rms_norm(qkv[:, :, 0], layer.self_qn, eps=c.norm_eps)
    k = ops.rms_norm(qkv[:, :, 1], layer.self_kn, eps=c.norm_eps)
    return q, k, qkv[:, :, 2]


def _cross_q(p: PackedFlashMap, layer: PackedLayer, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
             q_pos: torch.Tensor) -> torch.Tensor:
    """The cross-attention's queries [B, K, h, hd]: QK-normed and rotated at q_pos [B, K]."""
    c = p.drafter.config
    B, K, _ = x.shape
    if p.fused_norms:
        return fops.norm_linear(x, layer.q_w, layer.q_b, shift=shift, scale=scale, adaln_eps=c.norm_eps,
                                q_norm=layer.cross_qn, heads=c.heads, positions=q_pos, theta=c.rope_theta,
                                eps=c.norm_eps).view(B, K, c.heads, c.head_dim)
    q = ops.linear(ops.adaln(x, shift, scale, c.norm_eps), layer.q_w, layer.q_b).view(B, K, c.heads, c.head_dim)
    return ops.rms_norm(q, layer.cross_qn, q_pos, theta=c.rope_theta, eps=c.norm_eps)


def _modulated_linear(p: PackedFlashMap, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor, activation: str = "none") -> torch.Tensor:
    """act(adaln(x, shift, scale) @ weightᵀ + bias): the MLP's first linear and the final layer."""
    eps = p.drafter.config.norm_eps
    if p.fused_norms:
        return fops.norm_linear(x, weight, bias, activation=activation, shift=shift, scale=scale, adaln_eps=eps)
    return ops.linear(ops.adaln(x, shift, scale, eps), weight, bias, activation=activation)


def _block(p: PackedFlashMap, layer: PackedLayer, mods: torch.Tensor, x: torch.Tensor, memory_kv,
           q_pos: torch.Tensor, kv_len: torch.Tensor) -> torch.Tensor:
    """One DiT block (DiTBlock.forward at A = 1). x [B, K, w], mods [B or 1, 9, w], memory_kv (k, v) [B, cap, h, hd]."""
    B, K, w = x.shape
    sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = mods.unbind(1)
    o = ops.attention(*_self_qkv(p, layer, x, sh1, sc1)).reshape(B, K, w)
    x = ops.linear(o, layer.self_out_w, layer.self_out_b, gate=g1, residual=x)
    o = ops.attention(_cross_q(p, layer, x, sh2, sc2, q_pos), *memory_kv, kv_len).reshape(B, K, w)
    x = ops.linear(o, layer.cross_out_w, layer.cross_out_b, gate=g2, residual=x)
    h = _modulated_linear(p, x, sh3, sc3, layer.fc1_w, layer.fc1_b, activation="gelu_tanh")
    return ops.linear(h, layer.fc2_w, layer.fc2_b, gate=g3, residual=x)


def fused_denoise(p: PackedFlashMap, memory: FlashMapMemory, lengths: torch.Tensor, slot_inputs: torch.Tensor,
                  tau_s: float, tau_t: float, *, return_logits: bool, start: int = 0) -> ops.LmHeadOutput:
    """One network evaluation (FlashMapDrafter.denoise after the anchor entry is written).

    lengths: [B] int32, committed entries per row (the anchor sits at index lengths[b]); a device tensor
    so that a captured graph replays for any length within the memory's capacity.
    slot_inputs: [B, K, d_target] d-space states. start: the first memory entry read (the context
    window, `window_start`); keys keep their absolute positions. Returns (tokens [B, K] flow-vocab ids,
    logits or None).
    """
    d, c = p.drafter, p.drafter.config
    B, K, _ = slot_inputs.shape
    x = ops.linear(slot_inputs.to(p.slot_w.dtype), p.slot_w, p.slot_b)
    x = ops.rms_norm(x.unsqueeze(-2), p.slot_norm, eps=c.norm_eps).squeeze(-2) + p.slot_pos
    mods = p.mods.get((tau_s, tau_t)) if p.mods else None  # [1, ...]: one row serves every batch row
    if mods is None:
        tau = lambda v: torch.full((B,), v, dtype=torch.float32, device=x.device)
        cond = d._cond(tau(tau_s), tau(tau_t)).to(p.adaln_w.dtype)
        mods = ops.linear(cond, p.adaln_w, p.adaln_b).view(B, 9 * c.n_layers + 2, c.width)
    q_pos = lengths.long()[:, None] + 1 + torch.arange(K, device=x.device)
    kv_len = lengths + (1 - start)
    for i, layer in enumerate(p.layers):
        kv = (memory.k[i, :, :, start:].transpose(1, 2), memory.v[i, :, :, start:].transpose(1, 2))
        x = _block(p, layer, mods[:, 9 * i:9 * i + 9], x, kv, q_pos, kv_len)
    h = _modulated_linear(p, x, mods[:, -2], mods[:, -1], p.final_w, p.final_b)
    return ops.lm_head(h, p.head_w, p.head_b, return_logits=return_logits, softcap=c.softcap)


def fused_draft_step(p: PackedFlashMap, memory: FlashMapMemory, anchor_tokens: torch.Tensor, z: torch.Tensor,
                     lengths: torch.Tensor, *, steps: int, return_logits: bool = False,
                     start: int = 0) -> ops.LmHeadOutput:
    """Anchor entry + 1 or 2 evaluations (DESIGN.md §4). z [B, K, d_target] fp32 noise; lengths [B] int32;
    start: first memory entry read (context window). Graph-safe when memory.capacity > max(lengths) and
    start is 0 (nothing here reads data on the host)."""
    d = p.drafter
    entry = ops.linear(d.embed_tokens(anchor_tokens).to(p.anchor_w.dtype), p.anchor_w, p.anchor_b)
    entry = ops.rms_norm(entry.unsqueeze(-2), p.anchor_norm, eps=d.config.norm_eps)  # [B, 1, w]
    _write_entries(p, memory, entry, lengths)
    if steps == 1:
        return fused_denoise(p, memory, lengths, z, 0.0, 1.0, return_logits=return_logits, start=start)
    first = fused_denoise(p, memory, lengths, z, 0.0, 0.5, return_logits=True, start=start)
    mid = flow_map_jump(z, d.probs_to_state(torch.softmax(first.logits, dim=-1)), z.new_zeros(z.shape[:2]),
                        z.new_full(z.shape[:2], d.t_mid))
    return fused_denoise(p, memory, lengths, mid, 0.5, 1.0, return_logits=return_logits, start=start)


def fused_reads(memory: FlashMapMemory, window: Optional[int]) -> bool:
    """Whether the fused step can read `memory`: one context-window start for all rows (equal lengths, or
    every row within the window)."""
    return not (memory.ragged and window_start(memory.length, window))


def graphs_enabled(drafter: nn.Module) -> bool:
    """Whether `draft_block` may replay the fused step as a CUDA graph: `drafter.allow_graphs`, the
    environment (FLASHMAP_CUDA_GRAPHS=0 turns graphs off) and not while torch.compile traces."""
    return (not torch.compiler.is_compiling() and drafter.allow_graphs
            and os.environ.get("FLASHMAP_CUDA_GRAPHS", "1") != "0")


@torch.no_grad()
def fused_draft_block(p: PackedFlashMap, memory: FlashMapMemory, anchor_tokens: torch.Tensor, *,
                      steps: Optional[int] = None, noise: Optional[torch.Tensor] = None,
                      seed: Optional[torch.Tensor] = None, position: Optional[torch.Tensor] = None,
                      return_logits: bool = False, graph: bool = False) -> DraftBlock:
    """`draft_flashmap` (draft.py) on the fused ops (same arguments, same result up to fp rounding).

    graph: on CUDA, without return_logits and outside another capture, replay the step (noise included)
    from a CUDA graph cached on the memory (`draft_graph`); the tokens equal the eager ones. Once the
    memory outgrows a context window the step runs eagerly (the captured kernels read from entry 0).
    """
    d = p.drafter
    steps = d.config.draft_steps if steps is None else steps
    if steps not in (1, 2):
        raise ValueError(f"steps: must be 1 or 2, got {steps!r}")
    B, device = anchor_tokens.shape[0], anchor_tokens.device
    if noise is None:
        if seed is None or position is None:
            missing = ", ".join(n for n, v in (("seed", seed), ("position", position)) if v is None)
            raise ValueError(f"{missing}: required when noise is None (the noise is drawn from seed and position)")
        seed, position = per_row(seed, B, device, "seed"), per_row(position, B, device, "position")
    memory.reserve(memory.length + 1)
    start = window_start(memory.length, d.config.context_window)
    if not fused_reads(memory, d.config.context_window):  # the kernels read every row from one start entry
        raise ValueError("memory: the fused step reads one context window for all rows; rows of different "
                         "lengths past the window take the reference path (draft_block chooses it)")
    if (graph and start == 0 and not return_logits and anchor_tokens.is_cuda
            and not torch.cuda.is_current_stream_capturing()):
        g = draft_graph(p, memory, B, steps, seeded=noise is None)
        return DraftBlock(g(memory, anchor_tokens, noise, seed=seed, position=position).clone(), None)
    if noise is None:
        noise = d.sample_noise(seed, position)
    lengths = memory.lengths_on(device, torch.int32)
    out = fused_draft_step(p, memory, anchor_tokens, noise.float(), lengths, steps=steps,
                           return_logits=return_logits, start=start)
    return DraftBlock(d.to_target_ids(out.tokens), out.logits)


def draft_graph(p: PackedFlashMap, memory: FlashMapMemory, batch_size: int, steps: int, *,
                seeded: bool) -> "FusedDraftGraph":
    """The captured draft step for (batch_size, steps, seeded) on this memory, from `memory.draft_graphs`:
    captured on first use, captured again once its buffers were reallocated (`memory.reserve` empties
    the cache) or the weights re-packed; otherwise replayed as is."""
    key = (batch_size, steps, seeded)
    graph = memory.draft_graphs.get(key)
    if graph is None or not graph.valid_for(p, memory):
        graph = memory.draft_graphs[key] = FusedDraftGraph(p, memory, batch_size=batch_size, steps=steps,
                                                           seeded=seeded)
    return graph


def _layout(memory: FlashMapMemory) -> tuple:
    return memory.k.data_ptr(), memory.v.data_ptr(), tuple(memory.k.shape)


class FusedDraftGraph:
    """The fused draft step captured once in a CUDA graph and replayed per round (DESIGN.md §10).

    Valid for one packing of the weights, a fixed batch size and step count, and the memory's buffers
    (address and capacity): the captured kernels read the memory by address, and the committed length
    enters through a device tensor (the attention grid depends on the capacity only), so the memory may
    grow within its capacity between replays; after `memory.reserve` reallocated it, capture again.
    seeded=False takes the noise z [B, K, d_target]; seeded=True takes seed and position [B] int64 and
    draws the noise inside the graph (rng.drafter_xi: no host sync). Inputs are copied into static
    buffers; the returned tokens [B, K] (target ids) are a static buffer overwritten by the next call.
    """

    def __init__(self, p: PackedFlashMap, memory: FlashMapMemory, *, batch_size: int, steps: int = 1,
                 seeded: bool = False, warmup: int = 2):
        c, d, dev = p.drafter.config, p.drafter, memory.k.device
        if memory.length >= memory.capacity:
            raise RuntimeError("FusedDraftGraph: reserve memory capacity beyond the current length first")
        if window_start(memory.length, c.context_window):
            raise RuntimeError("FusedDraftGraph: the memory outgrew the context window (run the step eagerly)")
        self.p, self.steps, self.seeded, self._layout = p, steps, seeded, _layout(memory)
        # Static buffers in the memory's inference mode, so that later calls may write them in place.
        with torch.inference_mode(memory.k.is_inference()), torch.no_grad():
            self.anchor = torch.zeros(batch_size, dtype=torch.int64, device=dev)
            self.seed, self.position = (torch.zeros(batch_size, dtype=torch.int64, device=dev) for _ in range(2))
            self.z = torch.zeros(batch_size, c.block_size, c.d_target, dtype=torch.float32, device=dev)
            # The warm-up runs write the anchor entry at index `lengths`: the scratch slot, never a committed one.
            self.lengths = torch.full((batch_size,), memory.length, dtype=torch.int32, device=dev)

            def run() -> torch.Tensor:
                z = d.sample_noise(self.seed, self.position) if seeded else self.z
                return d.to_target_ids(fused_draft_step(p, memory, self.anchor, z, self.lengths, steps=steps).tokens)

            # The memory's device, not the caller's current one: streams, warm-up and capture all run there.
            with torch.cuda.device(dev):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(warmup):  # lazily built tables (the noise factor) and kernel plans, off the graph
                        run()
                torch.cuda.current_stream().wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.tokens = run()

    def valid_for(self, p: PackedFlashMap, memory: FlashMapMemory) -> bool:
        """True when a replay on `memory` is this capture's computation: same packed weights, same buffers
        (address and capacity), a free scratch slot for the anchor, and all entries within the context
        window (the capture reads from entry 0)."""
        return (p is self.p and _layout(memory) == self._layout and memory.length < memory.capacity
                and window_start(memory.length, p.drafter.config.context_window) == 0)

    def __call__(self, memory: FlashMapMemory, anchor_tokens: torch.Tensor, z: Optional[torch.Tensor] = None, *,
                 seed: Optional[torch.Tensor] = None, position: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.valid_for(self.p, memory):
            raise RuntimeError("FusedDraftGraph: the memory buffers changed or are full since capture, or it "
                               "outgrew the context window; reserve the capacity up front and capture again")
        if (z is None) != self.seeded or self.seeded and (seed is None or position is None):
            raise ValueError("FusedDraftGraph: pass z to a graph captured with seeded=False, "
                             "seed and position to one captured with seeded=True")
        with torch.inference_mode(memory.k.is_inference()):
            self.anchor.copy_(anchor_tokens)
            if self.seeded:
                self.seed.copy_(seed)
                self.position.copy_(position)
            else:
                self.z.copy_(z)
            self.lengths.copy_(memory.lengths_on(self.lengths.device, self.lengths.dtype))
        with torch.cuda.device(self.tokens.device):  # replay on the captured device's current stream
            self.graph.replay()
        return self.tokens
