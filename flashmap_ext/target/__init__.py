"""The target (DESIGN.md §6): model.py (Target: forward with taps, rollback, the HF model lookup),
taps.py (tap hooks, `capture_taps` for any HF causal LM), ragged.py (a ragged batch in one DynamicCache:
left_pad, ragged_inputs, rollback_rows), tables.py (the frozen embedding and LM head drafters read),
load.py (`load_target`), tiny.py (the `tiny-random` target), static.py + static_layers.py (StaticTarget: static
KV buffers, CUDA-graphed forwards)."""
from flashmap_ext.target.load import load_target
from flashmap_ext.target.model import Target, TargetOutput, cache_kwarg, hf_causal_lm, resolve_dtype
from flashmap_ext.target.ragged import left_align, left_pad, ragged_inputs, rollback_rows
from flashmap_ext.target.static import StaticTarget
from flashmap_ext.target.tables import TargetTables
from flashmap_ext.target.taps import (
                                      TapCapture,
                                      capture_taps,
                                      compute_taps,
                                      decoder_layers,
                                      final_norm,
                                      tap_hooks,
                                      tap_module,
)
from flashmap_ext.target.tiny import BYTE_EOS, TINY, ByteTokenizer, tiny_random_model

__all__ = ["Target", "StaticTarget", "TargetOutput", "TargetTables", "load_target", "resolve_dtype", "hf_causal_lm",
           "cache_kwarg",
           "decoder_layers", "tap_hooks", "tap_module", "final_norm", "compute_taps", "capture_taps", "TapCapture",
           "left_pad", "left_align", "ragged_inputs", "rollback_rows", "ByteTokenizer", "tiny_random_model", "TINY",
           "BYTE_EOS"]
