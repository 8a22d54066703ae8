"""FlashMap: the flow-map DiT drafter (DESIGN.md §5).

config.py (FlashMapConfig), block.py (the FlashMap block: adaLN-Zero DiT layer), qwen_block.py (the "qwen3"
trunk: DFlash's decoder layer), memory.py (context memory, DraftBlock), flow.py (flow math: clock, interpolant,
the flow-map jump), draft.py (`draft_flashmap`: the FlashMap path of `flashmap_ext.draft_block`), mode.py
(several noise draws, the best kept), model.py (FlashMapDrafter), fused.py (the same network on the fused ops).
"""
from flashmap_ext.drafters.flashmap.config import FlashMapConfig
from flashmap_ext.drafters.flashmap.memory import DraftBlock, FlashMapMemory
from flashmap_ext.drafters.flashmap.model import FlashMapDrafter

__all__ = ["FlashMapConfig", "FlashMapDrafter", "FlashMapMemory", "DraftBlock"]
