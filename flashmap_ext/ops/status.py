"""Status bits of `verify` rows, shared by the op wrapper and the float64 reference (csrc/verify/verify_core.h).

Errors: the row gets token 0 and num_accepted 0, and `verify(check=True)` raises naming the rows.
"""
__all__ = ["STATUS_NONFINITE", "STATUS_NO_FINITE", "STATUS_FALLBACK", "STATUS_BAD_DRAFT_PROB", "STATUS_BAD_PARAMS",
           "STATUS_ERRORS"]

STATUS_NONFINITE = 1       # a NaN or +inf logit among the valid ids of some slot
STATUS_NO_FINITE = 2       # some slot has no finite logit among the valid ids
STATUS_FALLBACK = 4        # residual mass was 0, the token was sampled from p (informational)
STATUS_BAD_DRAFT_PROB = 8  # a sampling slot's draft_probs give its draft q(x) outside (0, 1]
STATUS_BAD_PARAMS = 16     # temperature NaN / < 0 / +inf, top_p NaN or outside [0, 1], or top_k < 0 in a [B] tensor
STATUS_ERRORS = STATUS_NONFINITE | STATUS_NO_FINITE | STATUS_BAD_DRAFT_PROB | STATUS_BAD_PARAMS
