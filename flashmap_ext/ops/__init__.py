"""The flashmap ops: typed wrappers over torch.ops.flashmap.* (verify.py, dit.py) and their float64
references (verify_reference.py, dit_reference.py), which are also the CPU kernels' oracles."""
from flashmap_ext.ops.status import (
                                     STATUS_BAD_DRAFT_PROB,
                                     STATUS_BAD_PARAMS,
                                     STATUS_ERRORS,
                                     STATUS_FALLBACK,
                                     STATUS_NO_FINITE,
                                     STATUS_NONFINITE,
)
from flashmap_ext.ops.verify import VerifyOutput, sample, verify

__all__ = ["verify", "sample", "VerifyOutput", "STATUS_NONFINITE", "STATUS_NO_FINITE", "STATUS_FALLBACK",
           "STATUS_BAD_DRAFT_PROB", "STATUS_BAD_PARAMS", "STATUS_ERRORS"]
