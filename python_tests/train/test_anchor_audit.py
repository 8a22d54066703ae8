"""Anchor audit (SpecForge #470 / PR #473): a block anchored at a must not see the target's
taps at positions >= a (they do not exist when a is drafted) nor the tokens after a, in training — several
anchors per sequence, closer together than the block size, in one forward — and in held-out evaluation
(`evaluate.heldout.slot_hits`, which feeds memory the way decoding does). Replaced by noise, they must leave
the block's logits unchanged; the same noise one position earlier must change them (the test can fail)."""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import draft_block
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.evaluate.heldout import HeldoutSequence, slot_hits

T, K = 24, 8
ANCHORS = [3, 5, 6, 9, 11, 16]  # gaps 1-5 < K: the blocks overlap each other's label spans


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make(kind, target):
    torch.manual_seed(0)
    if kind == "flashmap":
        d = FlashMapDrafter.for_target(target, n_layers=2, width=32, heads=4, block_size=K, cond_dim=16,
                                       target_layer_ids=(0, 2), two_time=False)
        d.reset_parameters(zero_init=False)  # adaLN-Zero would make the output ignore the memory
    else:
        d = DFlashDrafter.for_target(target, num_hidden_layers=2, block_size=K + 1, mask_token_id=110,
                                     target_layer_ids=[0, 2])
    return d.eval()


def taps_like(d, batch, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, T, len(d.target_layer_ids) * 64, generator=g)


def train_logits(kind, d, taps, ids, anchors):
    """[B, A, K, V] logits of all blocks of one training forward."""
    if kind == "dflash":
        return d.forward_train(taps, ids, anchors)
    g = torch.Generator().manual_seed(7)
    b, a = anchors.shape
    z = d.noise_from_xi(torch.randn(b, a, K, 64, generator=g))
    tau = torch.zeros(b, a)
    return d.forward_train(taps, ids, anchors, z, tau, tau + 1)


def future_noise(taps, ids, a, seed=11):
    """taps at positions >= a and token ids at positions > a replaced by noise."""
    g = torch.Generator().manual_seed(seed)
    taps, ids = taps.clone(), ids.clone()
    taps[:, a:] = 10 * torch.randn(taps[:, a:].shape, generator=g)
    ids[:, a + 1:] = torch.randint(0, 110, ids[:, a + 1:].shape, generator=g)
    return taps, ids


@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_training_blocks_closer_than_the_block_size_see_nothing_of_their_future(kind, target):
    d = make(kind, target)
    taps, ids = taps_like(d, 2, 1), torch.randint(0, 110, (2, T))
    anchors = torch.tensor([ANCHORS, ANCHORS[::-1]])  # any order of anchors in a row
    base = train_logits(kind, d, taps, ids, anchors)
    for a in ANCHORS:
        moved = train_logits(kind, d, *future_noise(taps, ids, a), anchors)
        for row in range(2):
            for j, anchor in enumerate(anchors[row].tolist()):
                if anchor <= a:  # its context and token are all before the noise
                    torch.testing.assert_close(moved[row, j], base[row, j], atol=1e-5, rtol=0)
                else:
                    assert (moved[row, j] - base[row, j]).abs().max() > 1e-3, (a, anchor)
    earlier = taps.clone()
    earlier[:, ANCHORS[1] - 1] += 3.0  # the last memory position of the block at 5
    j = ANCHORS.index(ANCHORS[1])
    assert (train_logits(kind, d, earlier, ids, anchors)[0, j] - base[0, j]).abs().max() > 1e-3


class Spy:
    """Delegates the BlockDrafter protocol to `inner` and records each draft's logits by anchor position."""

    def __init__(self, kind, inner):
        self.kind, self.inner, self.seen = kind, inner, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, memory, anchor_tokens, *, num_tokens, seed=None, position):
        if self.kind == "dflash":
            logits = self.inner.draft_logits(memory, anchor_tokens, position)
        else:
            logits = draft_block(self.inner, memory, anchor_tokens, seed=seed, position=position,
                                 return_logits=True).logits
        self.seen[int(position[0])] = logits.clone()
        return self.inner.draft(memory, anchor_tokens, num_tokens=num_tokens, seed=seed, position=position)


def eval_logits(kind, d, taps, ids):
    seqs = [HeldoutSequence("math", f"s{i}", ids[i].tolist(), [0, 0] + [1] * (T - 2), taps=taps[i],
                            tap_layers=tuple(d.target_layer_ids)) for i in range(ids.shape[0])]
    spy = Spy(kind, d)
    slot_hits(spy, seqs, 4, batch_size=2)
    return spy.seen


@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_evaluation_drafts_see_nothing_of_their_future(kind, target):
    d = make(kind, target)
    taps, ids = taps_like(d, 2, 2), torch.randint(0, 110, (2, T))
    base = eval_logits(kind, d, taps, ids)
    assert sorted(base) == list(range(2, T - 4))  # every answer position with 4 answer tokens after it
    for a in (5, 9, 14):
        moved = eval_logits(kind, d, *future_noise(taps, ids, a))
        for pos in base:
            if pos <= a:
                torch.testing.assert_close(moved[pos], base[pos], atol=1e-5, rtol=0)
            else:
                assert (moved[pos] - base[pos]).abs().max() > 1e-3, (a, pos)
