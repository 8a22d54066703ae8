"""Weight alignment vs speed: the real target's 1- and 9-token forward and a FlashMap drafter
step, with the weights as the loaders leave them or copied into torch-allocated (64-byte aligned) storage.

Usage (pin it; one mode per process, alternate the modes):
    taskset -c 0 .venv/bin/python research/weight_alignment.py fp32|bf16 THREADS REPEATS as_loaded|aligned
prints one JSON line: misaligned / all tensors of target and drafter, median seconds of fwd1, fwd9, draft.
"""
import json
import sys

import torch

from flashmap_ext import draft_block
from flashmap_ext.assets.models import qwen05_dir
from flashmap_ext.draft_shapes.calibrate import median_time
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.target import Target

CONTEXT = 64
TAPS = (1, 12, 21)


def misaligned(module) -> list:
    tensors = list(module.parameters()) + list(module.buffers())
    return [sum(t.data_ptr() % 64 != 0 for t in tensors), len(tensors)]


def realign(module) -> None:
    for t in list(module.parameters()) + list(module.buffers()):
        t.data = t.data.clone()


def target_costs(target, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    cache = target.new_cache()
    target.forward(torch.randint(0, 1000, (1, CONTEXT), generator=gen), cache)
    out = {}
    for width in (1, 9):
        block = torch.randint(0, 1000, (1, width), generator=gen)

        def run():
            target.forward(block, cache, num_logits=width, tap_layer_ids=TAPS)
            target.rollback(cache, width)
        out[f"fwd{width}"] = median_time(run, repeats)
    return out


def draft_cost(drafter, repeats: int) -> float:
    gen = torch.Generator().manual_seed(1)
    c = drafter.config
    taps = torch.randn(1, CONTEXT, len(c.target_layer_ids) * c.d_target, generator=gen).to(drafter.dtype)
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, torch.randint(0, 1000, (1, CONTEXT), generator=gen), taps)
    return median_time(lambda: draft_block(drafter, memory, torch.tensor([5]), seed=0, position=CONTEXT), repeats)


def main(dtype: str, threads: int, repeats: int, mode: str) -> dict:
    torch.set_num_threads(threads)
    with torch.inference_mode():
        target = Target.from_pretrained(str(qwen05_dir()), dtype=dtype, device="cpu")
        drafter = FlashMapDrafter.from_pretrained("checkpoints/flashmap-map-qwen2.5-coder-0.5b", target.model,
                                                  dtype=target.dtype)
        result = dict(dtype=dtype, threads=threads, mode=mode, target_misaligned=misaligned(target.model),
                      drafter_misaligned=misaligned(drafter))
        if mode == "aligned":
            realign(target.model)
            realign(drafter)
        return dict(result, **target_costs(target, repeats), draft=draft_cost(drafter, repeats))


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
