"""Which drafter a checkpoint's config.json describes (`config_kind`), read by the drafter loaders and by
`load_target`, which refuses a drafter checkpoint passed as the target. No model code: a leaf module."""
from __future__ import annotations

KINDS = {"flashmap": "a FlashMap", "dflash": "a DFlash", "dflash2": "a DFlash2", "eagle3": "an EAGLE-3"}


def config_kind(cfg: dict) -> str | None:
    """'flashmap' | 'dflash' | 'dflash2' | 'eagle3' from a parsed config.json (its architectures / model_type,
    `speculators_model_type`), else None."""
    archs = cfg.get("architectures") or []
    if "DFlash2DraftModel" in archs or cfg.get("speculators_model_type") == "dflash2":  # z-lab's or speculators'
        return "dflash2"
    if "DFlashDraftModel" in archs:
        return "dflash"
    if "LlamaForCausalLMEagle3" in archs or cfg.get("speculators_model_type") is not None:
        return "eagle3"  # a speculators type other than eagle3 is refused by eagle3/formats.py
    if cfg.get("model_type") == "flashmap_drafter":
        return "flashmap"
    return None


def describe_kind(kind: str | None) -> str:
    """'FlashMap drafter' etc. for error messages."""
    return f"{KINDS[kind].split(' ', 1)[1]} drafter" if kind else "unknown drafter kind"
