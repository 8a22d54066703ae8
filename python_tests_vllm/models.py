"""Tiny random models on disk for the vLLM tests: a Qwen3 target (HF format, no tokenizer) and our DFlash
and FlashMap drafters for it, exported for vLLM (flashmap_ext.integrations.vllm)."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 256  # the target's rows; DFlash's mask token is the last one
PROMPT_LENGTHS = (5, 9, 14, 21)


def tiny_target(path: Path, seed: int = 0) -> torch.nn.Module:
    """A random 4-layer Qwen3 (head_dim 32: vLLM's CPU attention needs >= 32), saved to `path`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # sharper distributions than the default init: greedy decoding is non-trivial
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    save_tokenizer(path)
    return model


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer whose token i is the word `t{i}` (so vLLM can serve text prompts)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(tokenizer_models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(path)


def as_text(token_ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in token_ids)


DRAFT_VOCAB = 96  # the draft vocabulary's size where one is used (as in the committed checkpoints)


def draft_vocab(seed: int = 4) -> torch.Tensor:
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:DRAFT_VOCAB]


def tiny_dflash(target: torch.nn.Module, path: Path, seed: int = 1):
    """Our DFlash drafter (2 layers, block 4: K = 3 drafts, a 96-token draft vocabulary), saved in our
    released format to `path`."""
    from flashmap_ext import DFlashDrafter
    torch.manual_seed(seed)
    drafter = DFlashDrafter.for_target(target, mask_token_id=VOCAB - 1, num_hidden_layers=2, block_size=4,
                                       target_layer_ids=(1, 2), initializer_range=0.2,
                                       draft_vocab_size=DRAFT_VOCAB)
    drafter.set_draft_vocab(draft_vocab())
    drafter.save_pretrained(path)
    return drafter


def tiny_flashmap(target: torch.nn.Module, path: Path, draft_steps: int = 1, with_draft_vocab: bool = False,
                  seed: int = 2, block_size: int = 3):
    """Our FlashMap drafter (2 DiT blocks, width 64, 2 heads, K = block_size, optionally a 96-token draft
    vocabulary), random gates so every input matters, saved by `save_pretrained` to `path`."""
    from flashmap_ext import FlashMapDrafter
    torch.manual_seed(seed)
    drafter = FlashMapDrafter.for_target(target, n_layers=2, width=64, heads=2, mlp_ratio=2.0, block_size=block_size,
                                         cond_dim=32, draft_steps=draft_steps, target_layer_ids=(1, 2),
                                         draft_vocab_size=DRAFT_VOCAB if with_draft_vocab else None)
    drafter.reset_parameters(zero_init=False)
    if with_draft_vocab:
        drafter.set_draft_vocab(draft_vocab(), target)
    drafter.save_pretrained(path)
    return drafter


def prompts(seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def tiny_dflash2(target: torch.nn.Module, path: Path, seed: int = 5):
    """Our DFlash2 drafter (2 layers, block 4: K = 3 drafts, convolutions of 2 taps over groups of 16
    channels, selector rank 8 over the top 5), every weight random (the convolutions start as identities),
    saved by `save_pretrained` (z-lab's layout) to `path`."""
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    torch.manual_seed(seed)
    drafter = DFlash2Drafter.for_target(target, mask_token_id=VOCAB - 1, num_hidden_layers=2, block_size=4,
                                        target_layer_ids=(1, 2), initializer_range=0.2, conv_kernel_size=2,
                                        conv_group_size=16, selector_rank=8, selector_top_k=5).eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "conv" in name or "selector" in name:
                p.copy_(torch.randn_like(p) * (0.3 if "conv" in name else 1.0))
    drafter.save_pretrained(path)
    return drafter
