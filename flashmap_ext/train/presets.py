"""Named training presets: `--preset NAME` fills every setting the user did not give on the command line.

qwen3-8b follows the papers (DESIGN.md §5, §11): flow ~39k steps at peak LR 6e-4, distill
~23k steps at peak LR 5e-5, block 16, a 6-layer width-2048 DiT; warmup 4% then cosine; 512 anchors per
sequence of ≤ 3072 tokens; 4 sequences per process per step (global batch 4 × processes × accum). The
DFlash baseline gets the flow stage's budget (5 layers, block 16, γ = 7), as does DFlash2; so does EAGLE-3, with its own
optimiser settings (lr 5e-5, betas (0.9, 0.95), warmup 1.5%, clip 0.5, 32k draft vocabulary;
DESIGN.md §11). The draft vocabulary is capped at the target's. cpu-tiny / cpu-small are for runs
on a laptop CPU (minutes / an hour or so).
"""
from __future__ import annotations

import copy

from flashmap_ext.drafters.flashmap.config import SHAPES

# DFlash2 on the CPU presets: the reference's convolution group (16) and selector rank (256) would add ~25 %
# to the 9.75 M-parameter DFlash of recipes/train_real_drafters.sh; group 32 and rank 32 add 0.42 M + 0.55 M
# (width 896, 2 layers, 8,192-row draft vocabulary): 10.72 M, +9.9 %. qwen3-8b keeps the reference's values.
SMALL_DFLASH2 = dict(conv_group_size=32, selector_rank=32)

PRESETS: dict[str, dict[str, dict]] = {
    "qwen3-8b": {
        "data": dict(max_length=3072, num_anchors=512, batch_size=4, accum=1),
        "flashmap": dict(SHAPES["qwen3-8b"]),
        "dflash": dict(num_hidden_layers=5, block_size=16),
        "dflash2": dict(num_hidden_layers=5, block_size=16),
        "flow": dict(steps=39_000, lr=6e-4, warmup=0.04, save_every=1000),
        "distill": dict(steps=23_000, lr=5e-5, warmup=0.04, save_every=1000),
        "train-dflash": dict(steps=39_000, lr=6e-4, warmup=0.04, save_every=1000),
        "train-dflash2": dict(steps=39_000, lr=6e-4, warmup=0.04, save_every=1000),
        "eagle3": dict(draft_vocab_size=32_000, num_draft_tokens=15),
        "train-eagle3": dict(steps=39_000, lr=5e-5, warmup=0.015, betas=(0.9, 0.95), grad_clip=0.5,
                             save_every=1000),
    },
    "cpu-small": {
        "data": dict(max_length=1024, num_anchors=64, batch_size=4, accum=1),
        "flashmap": dict(SHAPES["cpu-small"]),
        "dflash": dict(num_hidden_layers=2, block_size=16),
        "dflash2": dict(num_hidden_layers=2, block_size=16, **SMALL_DFLASH2),
        "flow": dict(steps=3000, lr=6e-4, warmup=0.04, save_every=250),
        "distill": dict(steps=1500, lr=1e-4, warmup=0.04, save_every=250),
        "train-dflash": dict(steps=3000, lr=6e-4, warmup=0.04, save_every=250),
        "train-dflash2": dict(steps=3000, lr=6e-4, warmup=0.04, save_every=250),
        "eagle3": dict(draft_vocab_size=32_000, num_draft_tokens=15),
        "train-eagle3": dict(steps=3000, lr=6e-4, warmup=0.04, betas=(0.9, 0.95), grad_clip=0.5, save_every=250),
    },
    "cpu-tiny": {
        "data": dict(max_length=256, num_anchors=16, batch_size=4, accum=1),
        "flashmap": dict(SHAPES["cpu-tiny"]),
        "dflash": dict(num_hidden_layers=1, block_size=8),
        "dflash2": dict(num_hidden_layers=1, block_size=8, **SMALL_DFLASH2),
        "flow": dict(steps=300, lr=1e-3, warmup=0.04, save_every=100),
        "distill": dict(steps=150, lr=3e-4, warmup=0.04, save_every=100),
        "train-dflash": dict(steps=300, lr=1e-3, warmup=0.04, save_every=100),
        "train-dflash2": dict(steps=300, lr=1e-3, warmup=0.04, save_every=100),
        "eagle3": dict(draft_vocab_size=32_000, num_draft_tokens=7),
        "train-eagle3": dict(steps=300, lr=1e-3, warmup=0.04, betas=(0.9, 0.95), grad_clip=0.5, save_every=100),
    },
}


def preset(name: str) -> dict[str, dict]:
    """A copy of preset `name`; raises ValueError listing the known names."""
    if name not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)} (got {name!r})")
    return copy.deepcopy(PRESETS[name])
