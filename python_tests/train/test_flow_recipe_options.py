"""Recipe options of `train flow`: slot decay tied to K, LM head without recomputation."""
import math

import pytest
import torch
from test_flow_losses import make_batch, make_flow

from conftest import tiny_qwen3
from flashmap_ext.commands.train import slot_decay_arg
from flashmap_ext.train.flow import flow_loss, slot_weights


def test_slot_decay_tied_to_k_follows_dflash_rule():
    # DFlash: γ = 7 for 15 draft slots (block 16); our rule scales it with K: 7·K/15
    assert slot_weights(15, None).tolist() == pytest.approx([math.exp(-k / 7) for k in range(15)])
    assert slot_weights(8, None).tolist() == pytest.approx([math.exp(-k / (7 * 8 / 15)) for k in range(8)])
    assert slot_weights(7, None).tolist() == pytest.approx([math.exp(-k / 4) for k in range(7)])  # block 8: γ 4
    with pytest.raises(ValueError, match="slot decay"):
        slot_weights(8, 0.0)


def test_slot_decay_cli_values():
    assert slot_decay_arg("auto") is None
    assert slot_decay_arg("3.5") == 3.5
    for bad in ("0", "-1", "x", "nan"):
        with pytest.raises(ValueError, match="--slot-decay"):
            slot_decay_arg(bad)


def test_slot_decay_changes_the_loss_as_the_weights_say():
    target = tiny_qwen3()
    drafter = make_flow(target)
    batch = make_batch(drafter)
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731  same τ and noise for every call
    big, _ = flow_loss(drafter, batch, g(), slot_decay=1e9)     # ~uniform weights
    tied, _ = flow_loss(drafter, batch, g(), slot_decay=None)
    default, _ = flow_loss(drafter, batch, g())
    big, tied, default = (float(x.detach()) for x in (big, tied, default))
    assert default != pytest.approx(tied) and big != pytest.approx(tied)


def test_head_without_recompute_gives_the_same_loss_and_gradients():
    target = tiny_qwen3()
    grads = []
    for recompute in (True, False):
        drafter = make_flow(target, seed=1)
        loss, _ = flow_loss(drafter, make_batch(drafter), torch.Generator().manual_seed(5), anchor_chunk=2,
                            recompute_head=recompute)
        loss.backward()
        grads.append((float(loss.detach()), [p.grad.clone() for p in drafter.parameters() if p.grad is not None]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
    assert len(grads[0][1]) == len(grads[1][1]) > 0
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
