"""FlashMap: lossless speculative decoding with one-forward flow-map block drafters.

Public API:
    verify       fused acceptance step (greedy / rejection sampling), DESIGN.md §3.1
    draft_block  one FlashMap drafting call, DESIGN.md §3.2
    generate     the speculative decoding loop, DESIGN.md §7
"""
import torch  # noqa: F401  (must precede _C: it links against libtorch)

from flashmap_ext import _C  # noqa: F401  (loads the op library: registers torch.ops.flashmap.*)
from flashmap_ext.ops import verify, VerifyOutput

__all__ = ["verify", "VerifyOutput"]

try:  # parts that land in later issues; the package stays importable without them
    from flashmap_ext.drafters.flashmap import draft_block, DraftBlock  # noqa: F401
    __all__ += ["draft_block", "DraftBlock"]
except ImportError:
    pass
try:
    from flashmap_ext.speculate import generate  # noqa: F401
    __all__ += ["generate"]
except ImportError:
    pass
