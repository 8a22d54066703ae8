"""The `speculators` DFlash2 reference (speculators==0.9.0, `make test` installs it with --no-deps), imported
without its package `__init__` (which pulls in its data-generation stack: datasets, openai, ...): only the
model modules, which need torch, transformers and pydantic. `reference()` is None when it is not installed.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path

import torch

REFERENCE = "speculators==0.9.0"


@functools.lru_cache(maxsize=1)
def reference():
    """(DFlash2DraftModel, DFlash2SpeculatorConfig, speculators.config) or None when not installed."""
    spec = importlib.util.find_spec("speculators")
    if spec is None:
        return None
    root = Path(spec.submodule_search_locations[0])
    if "speculators.models.dflash2.core" not in sys.modules:
        for name, sub in (("speculators", ""), ("speculators.models", "models")):
            if name not in sys.modules:
                module = types.ModuleType(name)
                module.__path__ = [str(root / sub)]
                sys.modules[name] = module
    import speculators.config as config
    sys.modules["speculators"].SpeculatorModelConfig = config.SpeculatorModelConfig
    from speculators.models.dflash2.config import DFlash2SpeculatorConfig
    from speculators.models.dflash2.core import DFlash2DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: F401 (registers the proposal type)
    config.reload_schemas()
    return DFlash2DraftModel, DFlash2SpeculatorConfig, config


def build_reference(target, *, layers=2, block_size=4, taps=(1, 3), mask=110, rank=8, top_k=5,
                    layer_types=None, window=None, non_causal=True, seed=1):
    """A random reference DFlash2 drafter for the HF `target` (its embedding and LM head copied in), eager
    attention, every weight random (the convolutions too: the reference starts them as identities).
    `taps`: the reference's ids (HF hidden_states indices)."""
    model_cls, config_cls, config = reference()
    from transformers import Qwen3Config
    t = target.config
    extra = {} if layer_types is None else {"layer_types": layer_types, "sliding_window": window,
                                             "use_sliding_window": True}
    layer = Qwen3Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=96,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=512, rope_theta=1000.0, **extra)
    layer._attn_implementation = "eager"
    proposal = sys.modules["speculators.proposals.greedy"].GreedyTokenProposalConfig(
        speculative_tokens=block_size - 1)
    cfg = config_cls(transformer_layer_config=layer, draft_vocab_size=t.vocab_size, block_size=block_size,
                     aux_hidden_state_layer_ids=list(taps), mask_token_id=mask, conv_group_size=16,
                     selector_rank=rank, selector_top_k=top_k, sliding_window_non_causal=non_causal,
                     speculators_config=config.SpeculatorsConfig(
                         algorithm="dflash2", proposal_methods=[proposal], default_proposal_method="greedy",
                         verifier=config.VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"])))
    torch.manual_seed(seed)
    ref = model_cls(cfg)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.startswith(("embed_tokens", "lm_head", "verifier_lm_head")):
                continue
            scale = 1.0 if "selector" in name else 0.3 if "conv" in name else 0.1
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.dim() == 1 else 0.0))
        ref.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        ref.lm_head.weight.copy_(target.lm_head.weight)
        ref.verifier_lm_head.weight.copy_(target.lm_head.weight)
        ref.verifier_norm.weight.fill_(1.0)
    return ref.eval()


def reference_blocks(ref, taps, input_ids, num_anchors):
    """The reference's training forward over one sequence: (anchors [A], hidden [A, bs, d], unary logits
    [A, bs, V]) with the anchors it picks (its own random choice: seed torch first)."""
    t = input_ids.shape[1]
    out = ref._backbone_forward(taps, input_ids, torch.ones(1, t, dtype=torch.long),
                                torch.zeros(1, t, taps.shape[-1] // len(ref.target_layer_ids), dtype=taps.dtype),
                                torch.zeros(1, t, dtype=torch.long), max_anchors=num_anchors)
    hidden, logits, _, _, indices = out
    bs = ref.block_size
    return indices.view(-1, bs)[:, 0], hidden.view(-1, bs, hidden.shape[-1]), logits.view(-1, bs, logits.shape[-1])


def reference_chain(ref, hidden, logits, anchor: int) -> list[int]:
    """The reference selector's greedy walk over one block's draft slots (hidden, logits [bs, ·]): each
    slot's top-k unary candidates re-scored given the previous slot's choice, slot 1's being the anchor."""
    prev, chain = torch.tensor([anchor]), []
    for s in range(1, hidden.shape[0]):
        cands, scores = ref.candidate_selector.select(logits[None, s], hidden[None, s], prev)
        prev = cands[0, scores[0].argmax()][None]
        chain.append(int(prev))
    return chain
