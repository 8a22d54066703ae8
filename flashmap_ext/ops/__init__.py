"""The flashmap ops: typed wrappers over torch.ops.flashmap.* (verify.py, dit.py) and their float64
references (verify_reference.py, dit_reference.py), which are also the CPU kernels' oracles."""
from flashmap_ext.ops.status import *  # noqa: F403  (the STATUS_* bits of verify rows)
from flashmap_ext.ops.verify import VerifyOutput, sample, verify

__all__ = ["verify", "sample", "VerifyOutput"]
