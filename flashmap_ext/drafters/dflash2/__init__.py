"""DFlash2: DFlash with dynamic convolutions and a candidate selector (config.py, conv.py, selector.py,
model.py; speculators_format.py: the `speculators` layout)."""
from flashmap_ext.drafters.dflash2.config import DFlash2Config
from flashmap_ext.drafters.dflash2.model import DFlash2Drafter

__all__ = ["DFlash2Config", "DFlash2Drafter"]
