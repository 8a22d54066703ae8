"""--loss kl in every stage: soft labels line up with the labels, KL to a point mass is the CE (an identity
independent of the code), a real distribution matches a float64 loop, and caches without logits are refused."""
import math

import pytest
import torch

from flashmap_ext.cli import main
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.train.anchors import collate
from flashmap_ext.train.dflash import dflash_loss, slot_weights
from flashmap_ext.train.eagle3 import eagle3_loss
from flashmap_ext.train.flow import flow_loss
from train.test_train_cli import tiny_feature_cache

T, V = 20, 111


def items(feat, soft="one-hot", n=2, seed=0, k=4):
    """Sequences whose stored distribution at p is about the token at p + 1: a point mass on it (one-hot),
    or a random distribution with it on top (random); the last position has no next token."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, V, (T,), generator=g)
        nxt = torch.cat([ids[1:], ids[:1]])
        others = torch.stack([torch.randperm(V, generator=g)[:k] for _ in range(T)])
        others = torch.where(others == nxt[:, None], (others + 1) % V, others)
        top_ids = torch.cat([nxt[:, None], others[:, :k - 1]], 1)
        if soft == "one-hot":
            logp = torch.full((T, k + 1), -math.inf)
            logp[:, 0] = 0.0
        else:
            p = torch.softmax(torch.randn(T, k + 1, generator=g) + torch.tensor([3.0] + [0.0] * k), -1)
            logp = p.log()
        out.append({"input_ids": ids, "loss_mask": torch.tensor([0, 0] + [1] * (T - 2), dtype=torch.bool),
                    "taps": torch.randn(T, feat, generator=g), "topk_logp": logp.half(), "topk_ids": top_ids})
    return out


def test_collate_soft_labels_are_the_distribution_of_each_label():
    batch = collate(items(8, "random"), num_anchors=5, block_size=4, generator=torch.Generator().manual_seed(1))
    labelled = batch["labels"] != -100
    assert torch.equal(batch["soft_ids"][..., 0][labelled], batch["labels"][labelled])  # top-1 = the next token
    assert (batch["soft_ids"][~labelled] == -1).all()
    assert batch["soft_logp"].shape == (*batch["labels"].shape, 5)


def dflash(target):
    torch.manual_seed(0)
    return DFlashDrafter.for_target(target, num_hidden_layers=1, block_size=5, mask_token_id=0, target_layer_ids=[0, 2])


def test_dflash_kl_to_a_point_mass_is_the_ce(tiny_target):
    d = dflash(tiny_target)
    batch = collate(items(128), 6, 4, torch.Generator().manual_seed(2))
    ce, _ = dflash_loss(d, batch)
    kl, _ = dflash_loss(d, batch, loss="kl")
    both, _ = dflash_loss(d, batch, loss="kl", ce_weight=0.5)
    torch.testing.assert_close(kl, ce, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both, 1.5 * ce, atol=1e-5, rtol=1e-5)


def test_dflash_kl_matches_a_float64_loop(tiny_target):
    d = dflash(tiny_target)
    batch = collate(items(128, "random"), 3, 4, torch.Generator().manual_seed(3))
    got, _ = dflash_loss(d, batch, loss="kl")
    with torch.no_grad():
        logits = d.forward_train(batch["taps"], batch["input_ids"], batch["anchor_pos"]).double()
    w, num, den = slot_weights(4, 7 * 4 / 15).double(), 0.0, 0.0
    for b, a, s in torch.nonzero(batch["labels"] != -100).tolist():
        p = batch["soft_logp"][b, a, s].double().exp().tolist()
        q = torch.softmax(logits[b, a, s], -1).tolist()
        ids = batch["soft_ids"][b, a, s].tolist()
        kl = sum(pi * math.log(pi / q[t]) for pi, t in zip(p, ids) if pi > 0)
        kl += p[-1] * math.log(p[-1] / (1 - sum(q[t] for t in ids)))
        num, den = num + w[s] * kl, den + w[s]
    assert abs(got.item() - num / den) < 1e-4


def test_flow_kl_replaces_the_ce_at_tau_zero_blocks_only(tiny_target):
    d = FlashMapDrafter.for_target(tiny_target, n_layers=1, width=32, heads=2, block_size=4, two_time=False,
                                   target_layer_ids=(0, 2))
    d.reset_parameters(zero_init=False)
    point = collate(items(128), 6, 4, torch.Generator().manual_seed(4))
    soft = collate(items(128, "random"), 6, 4, torch.Generator().manual_seed(4))

    def loss(batch, tau0, **kw):
        return flow_loss(d, batch, torch.Generator().manual_seed(5), tau0_frac=tau0, **kw)[0]
    torch.testing.assert_close(loss(point, 0.5, loss="kl"), loss(point, 0.5), atol=1e-5, rtol=1e-5)
    assert (loss(soft, 1.0, loss="kl") - loss(soft, 1.0)).abs() > 1e-3   # every block at τ = 0: soft targets
    assert (loss(soft, 0.5, loss="kl") - loss(soft, 0.5)).abs() > 1e-3
    with pytest.raises(ValueError, match="--tau0-frac > 0"):
        loss(soft, 0.0, loss="kl")


def test_eagle3_kl_to_a_point_mass_is_the_ce(tiny_target):
    torch.manual_seed(0)
    d = Eagle3Drafter.for_target(tiny_target, target_layer_ids=(0, 1, 2), num_draft_tokens=3, dtype=torch.float32)
    batch = collate(items(192), 6, 3, torch.Generator().manual_seed(6))
    ce, _ = eagle3_loss(d, batch, steps=3)
    kl, _ = eagle3_loss(d, batch, steps=3, loss="kl")
    torch.testing.assert_close(kl, ce, atol=1e-5, rtol=1e-5)


def test_kl_needs_a_cache_with_logits(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHMAP_DEBUG", "1")
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    args = [*common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size", "2", "--steps", "1"]
    for stage in (["train", "dflash", "--mask-token-id", "0"], ["train", "flow", "--tau0-frac", "0.5"]):
        with pytest.raises(ValueError, match=r"^--loss kl: the feature cache .* holds no target logits") as err:
            main([*stage, *args, "--out", str(tmp_path / stage[1]), "--loss", "kl"])
        assert "\n" not in str(err.value)
    assert main(["features", *common, "--data", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "g"),
                 "--topk", "8"]) == 0
    assert main(["train", "dflash", "--mask-token-id", "0", *args[:4], str(tmp_path / "g"), *args[5:],
                 "--out", str(tmp_path / "kl"), "--loss", "kl", "--kl-ce-weight", "0.5"]) == 0
