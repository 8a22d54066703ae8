"""`RoundCommit`: a chain round's bookkeeping on a `StaticTarget`, done on the device (DESIGN.md §7).

After the (k + 1)-token verify forward and the `verify` op, a round rolls back the target's KV of the
rejected drafts, puts the kept positions' taps into the drafter's memory, takes the next anchor and hands
the committed tokens to the output. Here every step runs from the verify result's device tensors, with no
host read:

- the target: its device length drops by k − accepted (`StaticTarget.rollback_on_device`);
- the drafter's memory, the first way that applies ("mode"):
  "counted": the drafter's `memory_writer(device)` (FlashMap's fused path on CUDA: kv_append) writes the
  block's first accepted + 1 positions from the memory's length on, both device tensors;
  "block": a memory with `truncate` takes the whole block (`extend_memory`); the host cuts it back;
  "after": any other memory is extended by `settle`, once the count is on the host (no extra read);
- the next anchor: tokens[accepted], gathered into a buffer on the device (`anchor`);
- the readback: accepted, status and the round's k + 1 tokens in one [k + 3] int64 tensor.

The round's one host read is `readback.tolist()`, after all of the above is queued; the loop appends the
accepted tokens and the bonus to its output list, checks stop tokens and streams them from it. That list is
the output buffer: the tokens must reach the host every round anyway (stop tokens, streaming, the next
draft budget), and the readback brings them in the same copy as the count. `settle(k, n)` then updates the
host-side lengths (the target's host length, the memory's rows) from the value read.

CUDA: the device part is captured as one graph per k, the bookkeeping graph, replayed after the target's
graphed (k + 1)-token forward and the verify op; its inputs (the verify result, the block, the taps, the
memory's length) are copied into the graph's buffers first. A graph of its own rather than a part of the
forward's graph, because the two belong to different owners: the forward graph is the StaticTarget's (kept
across calls, shared by every drafter and the AR baseline, keyed by T and the taps), this one holds the
addresses of one call's drafter memory (reserved for the whole call up front) and is captured per call (a
few dozen small nodes), and the verify op between them reads the forward's logits in place. It costs one
graph launch and a few input copies per round instead of some 25 eager launches. As for the forwards: the
first round of a k runs eagerly (the warm-up), the second captures, later ones replay. On a CPU the same
device part runs eagerly. The memory is graphed in "counted" mode only; in "block" mode its
`extend_memory` runs eagerly before the replay (host offsets), and the rest is graphed.
"""
from __future__ import annotations

from typing import Optional

import torch

from flashmap_ext.target.static import StaticCache, StaticTarget


class RoundCommit:
    """The bookkeeping of one `generate` call's chain rounds (module docstring).

    Args:
        target: the call's StaticTarget.
        drafter: the call's drafter, or None (the AR baseline).
        memory: the drafter's memory after prefill, or None.
        capacity: memory entries the call may write (prompt + max_new_tokens + k + 1): reserved up front in
            "counted" mode, so that the buffers a graph holds never move.

    "counted" asks the drafter for `memory_writer(device)`: fn(memory, token_ids, taps, start, count) with
    start, count [B] int32 device tensors, capturable, or None; its memory offers reserve(n), grow(n) and
    lengths_on(device, dtype) (FlashMapDrafter / FlashMapMemory).
    """

    def __init__(self, target: StaticTarget, drafter, memory, capacity: int):
        self.target, self.drafter, self.memory = target, drafter, memory
        writer = getattr(drafter, "memory_writer", None)
        self.writer = writer(target.device) if writer is not None and memory is not None else None
        self.mode = ("none" if memory is None else "counted" if self.writer is not None
                     else "block" if hasattr(memory, "truncate") else "after")
        if self.mode == "counted":
            memory.reserve(capacity)
        self.anchor = torch.zeros(1, dtype=torch.int64, device=target.device)
        self._graphs: dict = {}   # k -> "warm", then (graph, input buffers, readback)
        self._round: tuple = ()   # (cache, block, taps, memory rows before) of the round to settle

    def __call__(self, cache: StaticCache, block: torch.Tensor, taps: Optional[torch.Tensor], result) -> torch.Tensor:
        """The device part: block [1, k + 1] (anchor + drafts), taps [1, k + 1, D] or None, `result` the
        verify op's output. Returns the readback [k + 3] int64 (accepted, status, tokens); the next anchor
        is in `anchor`. On CUDA both are graph buffers, overwritten by the next round."""
        memory = self.memory
        self._round = (cache, block, taps, list(memory.rows) if self.mode == "block" else None)
        if self.mode == "block":
            self.drafter.extend_memory(memory, block, taps)
        start = memory.lengths_on(block.device, torch.int32) if self.mode == "counted" else None
        inputs = (result.num_accepted, result.status, result.tokens, block,
                  taps if self.mode == "counted" else None, start)
        if block.device.type != "cuda":
            return self._device_part(cache, *inputs)
        return self._graphed(cache, inputs)

    def settle(self, k: int, accepted: int) -> None:
        """The host half, once the readback is read: `accepted` of the round's k drafts were kept."""
        cache, block, taps, rows = self._round
        self.target.settle_host_length(cache, k - accepted)
        kept = accepted + 1
        if self.mode == "counted":
            self.memory.grow(kept)
        elif self.mode == "block":
            self.memory.truncate([r + kept for r in rows])
        elif self.mode == "after":
            self.drafter.extend_memory(self.memory, block[:, :kept], None if taps is None else taps[:, :kept])

    def _device_part(self, cache, num_accepted, status, tokens, block, taps, start) -> torch.Tensor:
        """Rollback, counted memory write, next anchor, readback: device tensors only."""
        k = block.shape[1] - 1
        n = num_accepted.reshape(1).long()
        self.target.rollback_on_device(cache, k - n)
        if self.mode == "counted":
            self.writer(self.memory, block, taps, start, (n + 1).to(torch.int32))
        self.anchor.copy_(tokens[0].gather(0, n))
        return torch.cat([n, status.reshape(1).long(), tokens[0].long()])

    def _graphed(self, cache, inputs: tuple) -> torch.Tensor:
        """First round of a k: eager (the warm-up); second: capture; then copy the inputs in and replay."""
        k = inputs[3].shape[1] - 1
        entry = self._graphs.get(k)
        if entry is None:
            self._graphs[k] = "warm"
            return self._device_part(cache, *inputs)
        if entry == "warm":
            entry = self._graphs[k] = self._capture(cache, inputs)
        graph, buffers, readback = entry
        for buf, value in zip(buffers, inputs):
            if buf is not None:
                buf.copy_(value)
        graph.replay()
        return readback

    def _capture(self, cache, inputs: tuple) -> tuple:
        buffers = tuple(None if x is None else x.clone() for x in inputs)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.target.device)
        with torch.cuda.graph(graph):
            readback = self._device_part(cache, *buffers)
        return graph, buffers, readback


__all__ = ["RoundCommit"]
