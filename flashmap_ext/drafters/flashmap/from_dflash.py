"""A FlashMap flow model with the "qwen3" trunk started from a DFlash drafter's weights (`train flow
--init-from <DFlash checkpoint>`, DESIGN.md §5.2). The trunk's layers are DFlash's layers, so they copy over
name for name; the rest is set so that a one-step draft of a `tau_gated_input` flow model starts from DFlash's
computation:

- the tap projection and its norm are DFlash's `fc` (bias 0) and `hidden_norm`; the final norm is its `norm`;
- slot k's embedding is DFlash's mask-token embedding (its block token k + 1): at τ = 0 the gated slot state
  is 0 and `time_in` starts at 0, so the slot tokens are DFlash's mask tokens;
- the anchor entry is the anchor's embedding (anchor_proj the identity, bias 0) normed with DFlash's first
  layer's input norm, so the first layer's keys and values of the anchor are DFlash's. DFlash carries its
  anchor as a block token whose later layers see it transformed; the FlashMap memory holds the embedding
  only, so from the second layer on the anchor's keys differ, and training adapts them.

The logits then differ from DFlash's by the soft cap only (monotone: the same argmax).
"""
from __future__ import annotations

import torch


def dflash_mismatch(drafter, source) -> str | None:
    """Why `source` (a DFlashDrafter) cannot start `drafter` (a FlashMapDrafter), or None when it can (every
    differing shape flag at once, so one rerun fixes them all)."""
    c, s = drafter.config, source.config
    if c.trunk != "qwen3":
        return "a DFlash checkpoint starts the qwen3 trunk only (--trunk qwen3)"
    if not c.tau_gated_input:
        return "a DFlash checkpoint starts a --tau-gated-input flow model only (else the noise enters its draft)"
    pairs = [("--layers", c.n_layers, s.num_hidden_layers), ("--heads", c.heads, s.num_attention_heads),
             ("--kv-heads", c.memory_heads, s.num_key_value_heads), ("head dim", c.head_dim, s.head_dim),
             ("MLP units (--mlp-ratio x width)", c.mlp_hidden, s.intermediate_size),
             ("--block-size (its draft slots: DFlash's block size less the anchor)", c.block_size, s.block_size - 1),
             ("--tap-layers", tuple(c.target_layer_ids), tuple(s.target_layer_ids)),
             ("RoPE base", c.rope_theta, s.rope_theta), ("context window", c.context_window, s.context_window)]
    wrong = [f"{name}: {theirs} in the DFlash checkpoint, {mine} in this run" for name, mine, theirs in pairs
             if mine != theirs]
    if wrong:
        return "; ".join(wrong)
    if abs(c.norm_eps - s.rms_norm_eps) > 1e-9 or s.attention_bias or s.rope_scaling:
        return "its norm eps, attention bias or RoPE scaling differ from the qwen3 trunk's"
    if any(s.layer_attention(i) != (False, None) for i in range(s.num_hidden_layers)):
        return "its layers are causal or sliding-window; the qwen3 trunk attends bidirectionally to everything"
    if (s.input_embedding_scale, s.output_multiplier, s.final_logit_softcapping) != (1.0, 1.0, None):
        return "its embedding scale, output multiplier or logit soft cap are not the identity"
    return None


@torch.no_grad()
def start_from_dflash(drafter, source) -> None:
    """Copies `source`'s weights into `drafter` as the module docstring says (in place, drafter's dtype kept).
    ValueError (for --init-from to name) from `dflash_mismatch`."""
    why = dflash_mismatch(drafter, source)
    if why:
        raise ValueError(why)
    for mine, theirs in zip(drafter.blocks, source.layers):
        for a, b in (("attn", "self_attn"), ("mlp", "mlp"), ("input_norm", "input_layernorm"),
                     ("post_norm", "post_attention_layernorm")):
            getattr(mine, a).load_state_dict(getattr(theirs, b).state_dict())
    drafter.tap_proj.weight.copy_(source.fc.weight), drafter.tap_proj.bias.zero_()
    drafter.tap_norm.weight.copy_(source.hidden_norm.weight)
    drafter.final.norm.weight.copy_(source.norm.weight)
    mask = source.tables.embed(torch.tensor([source.config.mask_token_id]), torch.float32)
    drafter.slot_pos.copy_(mask.to(drafter.slot_pos.device).expand_as(drafter.slot_pos))
    drafter.anchor_proj.weight.copy_(torch.eye(drafter.config.d_target)), drafter.anchor_proj.bias.zero_()
    drafter.anchor_norm.weight.copy_(source.layers[0].input_layernorm.weight)
    drafter.time_in.weight.zero_(), drafter.time_in.bias.zero_()
