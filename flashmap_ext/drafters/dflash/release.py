"""A DFlash checkpoint in z-lab's released format, as engines load it: the one writer behind
`flashmap convert --to dflash` and vLLM's `export_dflash` (flashmap_ext.integrations.vllm).

z-lab's code, SGLang and vLLM read `config.json` (DFlashConfig.to_hf_dict) + `model.safetensors` (the
drafter's weights, no embedding: the target's is shared). A draft vocabulary (`draft_vocab_size`, buffer
`d2t`) adds one tensor: vLLM's DFlash drafter (`DFlashQwen3ForCausalLM`, as its EAGLE-3) owns an LM head
of the draft rows only, so `lm_head.weight` [V_d, d] = the target's LM-head rows `arange(V_d) + d2t`.
Our loader reads such a file back and checks that head against the target (model.py, from_pretrained).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from flashmap_ext.drafters.common import checkpoint as ckpt
from flashmap_ext.drafters.common.config import target_shape
from flashmap_ext.drafters.common.window import check_window_export
from flashmap_ext.drafters.dflash.config import DFlashConfig
from flashmap_ext.drafters.dflash.model import DFlashDrafter
from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.tables import TargetTables


def export_released(src: str | os.PathLike, dst: str | os.PathLike, target: Any = None, *,
                    unwindowed: bool = False) -> Path:
    """Reads the DFlash checkpoint `src` (any format we load) and writes the released format into `dst`
    (created; config.json and model.safetensors there are replaced). target: an HF causal LM or our
    `Target`; with it, `num_target_layers` is filled in when the source lacks it and the taps and hidden
    size are checked against it. A draft vocabulary needs it (its LM-head rows are written): ValueError
    naming `target` otherwise. NotImplementedError for our `context_window` (engines ignore it) unless
    `unwindowed`: then it is left out (`check_window_export`). Other
    errors: what `DFlashDrafter.from_pretrained` raises (one line naming the field). Weights keep their stored dtype (config `torch_dtype`). Returns `dst`."""
    config = ckpt.load_config(src, "dflash", DFlashConfig.from_hf_dict)
    check_window_export(src, config, unwindowed)
    if config.draft_vocab_size is not None and target is None:
        raise ValueError(f"target: {src} drafts from a {config.draft_vocab_size}-token vocabulary; pass the "
                         "target so that its LM-head rows can be written (vLLM's DFlash drafter owns them)")
    drafter = DFlashDrafter.from_pretrained(src, target, device="cpu")
    drafter.config = dataclasses.replace(drafter.config, context_window=None)  # refused above unless unwindowed
    if drafter.config.num_target_layers is None and target is not None:
        layers = target_shape(hf_causal_lm(target).config)["num_target_layers"]
        drafter.config = dataclasses.replace(drafter.config, num_target_layers=layers)
    dtype = drafter.fc.weight.dtype
    tensors = dict(drafter.state_dict())
    if drafter.config.draft_vocab_size is not None:
        tensors["lm_head.weight"] = draft_head(target, drafter).to("cpu", dtype)
    ckpt.write_checkpoint(dst, {**drafter.config.to_hf_dict(), "torch_dtype": ckpt.dtype_name(dtype)}, tensors)
    return Path(dst)


def draft_head(target: Any, drafter: DFlashDrafter):
    """[V_d, d]: the target's LM-head rows of the drafter's draft vocabulary. NotImplementedError for a
    head with a bias (the released format has no place for it)."""
    tables = TargetTables.from_target(target, drafter.vocab.target_ids)
    if tables.head_bias is not None:
        raise NotImplementedError("target: an LM head with a bias cannot be written to the DFlash format")
    return tables.head_weight.detach()
