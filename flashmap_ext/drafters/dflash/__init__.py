"""DFlash: the block-diffusion baseline drafter (config.py, model.py; blocks.py: training-time blocks)."""
from flashmap_ext.drafters.dflash.config import DFlashConfig
from flashmap_ext.drafters.dflash.model import DFlashDrafter, DFlashMemory

__all__ = ["DFlashConfig", "DFlashDrafter", "DFlashMemory"]
