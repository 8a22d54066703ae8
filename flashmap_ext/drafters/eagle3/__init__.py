"""EAGLE-3: the autoregressive baseline drafter (config.py, model.py; tree.py: draft trees; ttt.py: the
training-time test)."""
from flashmap_ext.drafters.eagle3.config import Eagle3Config
from flashmap_ext.drafters.eagle3.model import Eagle3Drafter, Eagle3Memory
from flashmap_ext.drafters.eagle3.tree import DraftTree

__all__ = ["Eagle3Config", "Eagle3Drafter", "Eagle3Memory", "DraftTree"]
