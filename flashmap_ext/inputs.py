"""What `generate` takes as its prompt(s): token ids in the forms a user holds them, or a tokenizer's output.

`as_prompts(input_ids)` returns (prompts, batched): one prompt (an [S] int64 tensor or what became one) or a
list of B prompts, each as `generate` checks it (speculate.check_prompt). Accepted:
  - one prompt: an [S] or [1, S] integer tensor (or array), a list of ints;
  - B prompts: a list of lists of ints or of [S_b] tensors (lengths may differ);
  - a tokenizer's output (or a list of them, one per prompt): a `BatchEncoding` or dict with "input_ids" (from `tokenizer(text)`,
    `tokenizer(texts, padding=True)` or `apply_chat_template(..., return_tensors="pt")`): rows [1, S] or
    one list of ints are one prompt, [B, S] rows or a list of lists are B prompts, and its
    "attention_mask", when there, drops the padding; a `tokenizers.Encoding` (or a list of them).
Everything else (text, a list of strings, a [B, S] tensor with B > 1 and no mask, non-integers) is a
TypeError / ValueError naming `input_ids` and the fix, raised before any model work.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flashmap_ext.checks import describe

TOKENIZE_FIRST = ("tokenize it first and pass the tokenizer's output as is, e.g. "
                  "tokenizer(text) or tokenizer.apply_chat_template(messages, add_generation_prompt=True)")


def as_prompts(input_ids: Any) -> tuple[Any, bool]:
    """(one prompt, False) or (a list of prompts, True); TypeError / ValueError naming `input_ids`."""
    if isinstance(input_ids, (str, bytes)):
        raise TypeError(f"input_ids: text ({describe(input_ids)}), not token ids: {TOKENIZE_FIRST}")
    if isinstance(input_ids, (list, tuple)) and not input_ids:
        raise ValueError("input_ids: an empty list of prompts: pass one prompt (at least one token, e.g. BOS) "
                         "or a list of them")
    if isinstance(input_ids, Mapping):
        return _from_mapping(input_ids)
    if _is_encoding(input_ids):
        return _encoding_ids(input_ids), False
    if isinstance(input_ids, (list, tuple)) and input_ids:
        if all(isinstance(p, (str, bytes)) for p in input_ids):
            raise TypeError(f"input_ids: a list of {len(input_ids)} texts, not token ids: tokenize them first and "
                            f"pass the tokenizer's output as is, e.g. tokenizer(texts)")
        if all(_is_encoding(p) for p in input_ids):
            return [_encoding_ids(p) for p in input_ids], True
        if all(isinstance(p, Mapping) for p in input_ids):  # one tokenizer output per prompt
            return [_single(_from_mapping(p), row) for row, p in enumerate(input_ids)], True
        if any(isinstance(p, (list, tuple)) or isinstance(p, torch.Tensor) and p.dim() >= 1 for p in input_ids):
            return list(input_ids), True  # a list of prompts: each is checked, and named by its row, on its own
    ids = as_ids(input_ids)
    if ids.dim() == 2 and ids.shape[0] > 1:
        raise ValueError(f"input_ids: a tensor of shape {list(ids.shape)} holds {ids.shape[0]} prompts: pass them "
                         f"as a list (list(input_ids)) or the tokenizer's output with its attention_mask")
    return ids, False


def _from_mapping(encoding: Mapping) -> tuple[Any, bool]:
    """A tokenizer's output (BatchEncoding or dict): its input_ids, without the padding its attention_mask marks."""
    if "input_ids" not in encoding:
        raise ValueError(f"input_ids: a mapping without 'input_ids' (keys: {sorted(map(str, encoding))[:6]}): pass a "
                         f"tokenizer's output, or the token ids themselves")
    ids, mask = encoding["input_ids"], encoding.get("attention_mask")
    if isinstance(ids, (str, bytes)) or isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], (str, bytes)):
        raise TypeError(f"input_ids: the mapping's 'input_ids' hold text, not token ids: {TOKENIZE_FIRST}")
    rows = as_ids(ids, "the mapping's 'input_ids'") if not _is_ragged(ids) else \
        [as_ids(r, f"prompt row {row} of the mapping's 'input_ids'") for row, r in enumerate(ids)]
    masks = None if mask is None else (_mask(mask) if not _is_ragged(mask) else [_mask(m) for m in mask])
    if isinstance(rows, torch.Tensor) and rows.dim() == 1:
        return _unpad(rows, masks), False
    if isinstance(rows, torch.Tensor) and rows.dim() != 2:
        raise ValueError(f"input_ids: the mapping's 'input_ids' have shape {list(rows.shape)}, expected [S] or [B, S]")
    if masks is not None and len(masks) != len(rows):
        raise ValueError(f"input_ids: {len(rows)} rows of 'input_ids' but {len(masks)} of 'attention_mask'")
    prompts = [_unpad(r, None if masks is None else masks[row], row) for row, r in enumerate(rows)]
    listed = isinstance(ids, (list, tuple))  # `tokenizer(texts)` over a list of texts, even of one: a batch
    return (prompts[0], False) if len(prompts) == 1 and not listed else (prompts, True)


def _single(prompts: tuple[Any, bool], row: int) -> Any:
    """The one prompt of the tokenizer output at `row` of a list of them; ValueError naming the row when it holds
    several."""
    prompt, batched = prompts
    if batched and len(prompt) == 1:  # `tokenizer([text])`: one prompt in a list
        return prompt[0]
    if batched:
        raise ValueError(f"input_ids: a list of tokenizer outputs, whose output at row {row} holds {len(prompt)} "
                         f"prompts: pass that output alone, or one output per prompt")
    return prompt


def _unpad(ids: torch.Tensor, mask, row: int | None = None) -> torch.Tensor:
    """The ids whose attention_mask is 1 (all of them without a mask); left or right padding alike. A mismatch is
    a ValueError naming the prompt's `row` of a batch."""
    if mask is None:
        return ids
    if mask.shape != ids.shape:
        where = "" if row is None else f" in prompt row {row}"
        raise ValueError(f"input_ids: 'attention_mask' of shape {list(mask.shape)} does not match 'input_ids' "
                         f"of shape {list(ids.shape)}{where}")
    return ids[mask.bool()]


def _mask(value) -> torch.Tensor:
    """An attention_mask (ints or bools) as a tensor; TypeError naming it when it is not one."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"input_ids: the mapping's 'attention_mask' is not a mask of 0/1: {describe(value)}") from None


def _is_ragged(value) -> bool:
    """A list of rows (lists or tensors): a tokenizer's batch without padding."""
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(r, (list, tuple)) or isinstance(r, torch.Tensor) and r.dim() == 1 for r in value)


def _is_encoding(value) -> bool:
    """A `tokenizers.Encoding` (what a fast tokenizer's `encode` returns), without importing tokenizers."""
    return type(value).__module__.split(".")[0] == "tokenizers" and hasattr(value, "ids")


def _encoding_ids(encoding) -> torch.Tensor:
    """A tokenizers.Encoding's ids, without padding (its attention_mask)."""
    return _unpad(torch.tensor(encoding.ids, dtype=torch.int64),
                  torch.tensor(encoding.attention_mask, dtype=torch.int64))


def as_ids(value, what: str = "input_ids") -> torch.Tensor:
    """torch.as_tensor(value) for integer ids (one prompt); TypeError naming `input_ids` for anything else."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"input_ids: text ({describe(value)}), not token ids: {TOKENIZE_FIRST}")
    try:
        ids = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"input_ids: expected token ids (an [S] integer tensor, a list of ints, a list of prompts "
                        f"or a tokenizer's output), got {what} = {describe(value)}") from None
    if ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        raise TypeError(f"input_ids: expected integer token ids, got {what} of dtype {ids.dtype}")
    if ids.is_meta:
        raise ValueError(f"input_ids: {what} is a meta tensor (no values): pass a cpu or cuda tensor")
    return ids
