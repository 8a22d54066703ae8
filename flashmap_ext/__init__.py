"""FlashMap: lossless speculative decoding with one-forward flow-map block drafters.

Public API:
    verify, sample          fused acceptance step and the plain sampler (DESIGN.md §3.1)
    draft_block             one drafting call for every drafter (DESIGN.md §3.2)
    FlashMapDrafter         the flow-map DiT drafter (DESIGN.md §5)
    DFlashDrafter           block-diffusion baseline drafter (DFlash)
    DFlash2Drafter          DFlash with dynamic convolutions and a candidate selector (DFlash2)
    Eagle3Drafter           autoregressive baseline drafter (EAGLE-3)
    CheckpointError         a drafter checkpoint that cannot be loaded (one line: path, problem, kind)
    Target, load_target     Hugging Face target adapter (DESIGN.md §6); load_target takes a hub name, a path or
                            "qwen2.5-coder-0.5b" (the offline target)
    auto_dtype              "bf16" where this machine runs it fast (a GPU, a CPU with bf16 hardware), else "fp32"
    generate                the lossless speculative decoding loop (DESIGN.md §7): token ids or a tokenizer's
                            output, one prompt or a list; tree=TreeSpec(...) drafts token trees (one prompt)
    VerifyOutput, DraftBlock, GenerateOutput, GenerateStats   what verify, draft_block and generate return
    TreeSpec                generate(..., tree=TreeSpec(depth, topk, num_nodes))
    Timer                   generate(..., timer=Timer(sync=True)): exact phase times of every round
These are the README's names ("Python API"); everything else is imported from its module.
"""
import torch  # noqa: F401  (must precede _C: it links against libtorch)

try:
    from flashmap_ext import _C  # noqa: F401  (loads the op library: registers torch.ops.flashmap.*)
except ImportError as _err:  # not built yet (a fresh clone, or `make` still compiling): say so in one line
    if "_C" not in str(_err):
        raise
    raise ImportError("flashmap_ext._C, the compiled op library, is not built in this checkout: run `make build` "
                      "(or `pip install --no-build-isolation .`) and wait for it to finish") from _err
from flashmap_ext.bench.machine import auto_dtype
from flashmap_ext.drafters.common.base import DraftBlock
from flashmap_ext.drafters.common.checkpoint import CheckpointError
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from flashmap_ext.drafters.drafting import draft_block
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.ops import VerifyOutput, sample, verify
from flashmap_ext.speculate import GenerateOutput, GenerateStats, Timer, TreeSpec, generate
from flashmap_ext.target import Target
from flashmap_ext.target.load import load_target_python as load_target  # errors name spec, device

__all__ = ["verify", "sample", "VerifyOutput", "draft_block", "DraftBlock", "FlashMapDrafter",
           "DFlashDrafter", "DFlash2Drafter", "Eagle3Drafter", "CheckpointError", "Target", "load_target", "generate",
           "GenerateOutput", "GenerateStats", "TreeSpec", "Timer", "auto_dtype"]
