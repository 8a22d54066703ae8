"""Ragged drafter memories: rows of different lengths in one memory, with per-row
extend (`extend_memory` appends T positions to every row, each from its own length) and `truncate`.
Each row of a ragged batch of 4 must draft what it drafts alone in a batch-1 memory: tokens exactly,
logits within fp32 tolerance (a batch of 4 with masks rounds differently from a solo run). FlashMap
1 and 2 steps (reference path, fused ops on CPU, a context window), DFlash and EAGLE-3. Tiny random Qwen3, CPU."""
import pytest
import torch

import flashmap_ext as fm
from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import fused
from flashmap_ext.drafters.flashmap.memory import FlashMapMemory

LENGTHS = (5, 11, 8, 14)     # prompt tokens per row; the last one is the anchor
KEPT = (1, 3, 2, 4)          # of the 4 positions a round appends, each row keeps this many
TOL = dict(atol=2e-4, rtol=2e-4)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.fixture(scope="module")
def rows(model):
    """Per row: token ids [n + 4] and their taps [n + 4, 4·d] (HF hidden_states of every layer)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for n in LENGTHS:
        ids = torch.randint(0, 110, (1, n + 4), generator=g)
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        out.append((ids[0], torch.cat(hidden[1:], dim=-1)[0]))
    return out


def _taps(drafter, taps):
    d = taps.shape[-1] // 4
    return torch.cat([taps[..., i * d:(i + 1) * d] for i in drafter.target_layer_ids], dim=-1)


def _left_aligned(drafter, rows, lo, hi):
    """Positions lo[b]..lo[b] + T − 1 of each row, left-aligned in [B, T] (rows shorter than T padded
    with their own last position: scratch that `truncate` cuts)."""
    T = max(h - l for l, h in zip(lo, hi))
    pick = [torch.arange(l, l + T).clamp(max=h - 1) for l, h in zip(lo, hi)]
    ids = torch.stack([r[0][p] for r, p in zip(rows, pick)])
    taps = torch.stack([_taps(drafter, r[1])[p] for r, p in zip(rows, pick)])
    return ids, taps


def _draft(drafter, memory, anchors, positions, steps, path, seeds):
    if path == "fused":
        return fused.fused_draft_block(fused.pack_weights(drafter), memory, anchors, steps=steps, seed=seeds,
                                       position=positions, return_logits=True)
    return fm.draft_block(drafter, memory, anchors, steps=steps, seed=seeds, position=positions, return_logits=True)


def _extend(drafter, memory, ids, taps, path):
    if path == "fused":
        fused.fused_extend_memory(fused.pack_weights(drafter), memory, ids, taps)
    else:
        drafter.extend_memory(memory, ids, taps)


def _two_rounds(drafter, rows, batch, steps, path):
    """Drafts after the prompt, then after a round that appended 4 positions and kept KEPT of them."""
    memory = drafter.new_memory(len(batch), "cpu")
    sel = [rows[b] for b in batch]
    n = [LENGTHS[b] for b in batch]
    _extend(drafter, memory, *_left_aligned(drafter, sel, [0] * len(n), [k - 1 for k in n]), path)
    memory.truncate(torch.tensor(n) - 1)
    seeds = torch.tensor(batch) + 3  # a row's seed, whatever its batch-mates
    first = _draft(drafter, memory, torch.stack([r[0][k - 1] for r, k in zip(sel, n)]), torch.tensor(n) - 1,
                   steps, path, seeds)
    _extend(drafter, memory, *_left_aligned(drafter, sel, [k - 1 for k in n], [k + 3 for k in n]), path)
    kept = [KEPT[b] for b in batch]
    memory.truncate(torch.tensor(n) - 1 + torch.tensor(kept))
    at = [k - 1 + m for k, m in zip(n, kept)]
    second = _draft(drafter, memory, torch.stack([r[0][a] for r, a in zip(sel, at)]), torch.tensor(at), steps, path,
                    seeds)
    return first, second


def _flashmap(model, window=None):
    torch.manual_seed(1)
    d = fm.FlashMapDrafter.for_target(model, n_layers=2, width=64, heads=4, block_size=6, cond_dim=32,
                                      target_layer_ids=(0, 2), context_window=window, init="random")
    return d.eval()


def _eagle3(model, window=None):
    torch.manual_seed(1)
    return fm.Eagle3Drafter.for_target(model, num_draft_tokens=4, dtype=torch.float32).eval()


def _dflash(model, window=None):
    torch.manual_seed(1)
    return fm.DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=2, block_size=6,
                                       target_layer_ids=[0, 2], dtype=torch.float32, context_window=window).eval()


CASES = [("flashmap", 1, "reference", None), ("flashmap", 2, "reference", None), ("flashmap", 1, "fused", None),
         ("flashmap", 2, "fused", None), ("flashmap", 2, "reference", 6), ("dflash", None, "reference", None),
         ("dflash", None, "reference", 6), ("eagle3", None, "reference", None)]


@pytest.mark.parametrize("kind, steps, path, window", CASES)
def test_each_row_of_a_ragged_batch_drafts_what_it_drafts_alone(model, rows, kind, steps, path, window):
    drafter = {"flashmap": _flashmap, "dflash": _dflash, "eagle3": _eagle3}[kind](model, window)
    steps = steps if kind == "flashmap" else None
    together = _two_rounds(drafter, rows, [0, 1, 2, 3], steps, path)
    for b in range(4):
        alone = _two_rounds(drafter, rows, [b], steps, path)
        for r in range(2):
            assert torch.equal(together[r].tokens[b], alone[r].tokens[0]), f"row {b}, round {r}"
            torch.testing.assert_close(together[r].logits[b], alone[r].logits[0], **TOL)


def test_truncate_refuses_growth_and_the_fused_step_a_ragged_window(model, rows):
    drafter = _flashmap(model, window=3)
    memory = drafter.new_memory(2, "cpu")
    drafter.extend_memory(memory, *_left_aligned(drafter, rows[:2], [0, 0], [4, 10]))
    with pytest.raises(ValueError, match="lengths"):
        memory.truncate(torch.tensor([4, 11]))
    memory.truncate(torch.tensor([4, 10]))
    assert memory.ragged and memory.lengths.tolist() == [4, 10]
    with pytest.raises(ValueError, match="memory"):
        fused.fused_draft_block(fused.pack_weights(drafter), memory, torch.tensor([1, 2]), seed=0,
                                position=torch.tensor([4, 10]))


# RaggedRows.lengths_on: the row lengths on a device without a host sync (the graphed CUDA step reads them;
# python_tests/drafters/test_draft_graph.py::test_graph_replay_syncs_nothing runs it under sync-debug mode).
def _rows_memory(rows):
    k = torch.zeros(1, len(rows), 1, 16, 2)
    return FlashMapMemory(k, k.clone(), lengths=rows)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_lengths_on_cpu_is_the_rows(dtype):
    out = _rows_memory([3, 0, 11]).lengths_on(torch.device("cpu"), dtype)
    assert out.dtype == dtype and out.device.type == "cpu" and out.tolist() == [3, 0, 11]


def test_lengths_on_is_a_fresh_tensor_each_call():
    memory = _rows_memory([2, 5])
    first = memory.lengths_on("cpu")
    memory.truncate([1, 4])
    assert first.tolist() == [2, 5] and memory.lengths_on("cpu").tolist() == [1, 4]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lengths_on_cuda_copies_without_a_sync():
    memory = _rows_memory([7, 9])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = memory.lengths_on(torch.device("cuda"), torch.int32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.dtype == torch.int32 and out.cpu().tolist() == [7, 9]
