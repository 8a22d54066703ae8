"""train/anchors.py: anchors are emitted response tokens, labels are the next K tokens of the text."""
import pytest
import torch

from flashmap_ext.train.anchors import block_labels, candidate_anchors, collate, sample_anchors

WORDS = "<s> user hi </s> <s> assistant the cat sat down </s>".split()
VOCAB = sorted(set(WORDS))
IDS = torch.tensor([VOCAB.index(w) for w in WORDS])
MASK = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)  # the response: "the cat sat down </s>"


def words(labels):
    return [VOCAB[i] if i >= 0 else None for i in labels.tolist()]


def test_labels_line_up_with_the_text():
    assert candidate_anchors(MASK).tolist() == [6, 7, 8, 9]  # "the" … "down": each followed by a response token
    lab = block_labels(IDS, MASK, torch.tensor([6, 8, 9, -1]), k=3)
    assert words(lab[0]) == ["cat", "sat", "down"]
    assert words(lab[1]) == ["down", "</s>", None]  # past the end of the sequence
    assert words(lab[2]) == ["</s>", None, None]
    assert words(lab[3]) == [None, None, None]  # padded block
    prompt_only = MASK.clone()
    prompt_only[8:] = False  # the loss mask, not the length, ends supervision
    assert words(block_labels(IDS, prompt_only, torch.tensor([6]), k=3)[0]) == ["cat", None, None]


def test_sample_anchors_uniform_without_replacement():
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(WORDS))
    for _ in range(2000):
        a = sample_anchors(MASK, 2, g)
        assert a.tolist() == sorted(set(a.tolist())) and len(a) == 2
        counts[a] += 1
    assert counts[[0, 1, 2, 3, 4, 5, 10]].sum() == 0
    torch.testing.assert_close(counts[6:10] / 2000, torch.full((4,), 0.5), atol=0.05, rtol=0)
    assert sample_anchors(MASK, 99).tolist() == [6, 7, 8, 9]
    assert sample_anchors(torch.zeros(5, dtype=torch.bool), 4).numel() == 0
    with pytest.raises(ValueError, match="num_anchors"):
        sample_anchors(MASK, 0)


def test_collate_pads_and_every_label_is_the_token_k_after_its_anchor():
    g = torch.Generator().manual_seed(3)
    items = []
    for t in (11, 30, 4):
        ids = torch.randint(0, 50, (t,), generator=g)
        mask = torch.rand(t, generator=g) < 0.7
        items.append({"input_ids": ids, "loss_mask": mask, "taps": torch.randn(t, 6, dtype=torch.bfloat16)})
    items[2]["loss_mask"][:] = False  # no candidate at all: a row of padded blocks
    batch = collate(items, num_anchors=5, block_size=4, generator=g, taps_dtype=torch.float32)
    b, t, a, k = 3, 30, batch["anchor_pos"].shape[1], 4
    assert batch["input_ids"].shape == (b, t) and batch["taps"].shape == (b, t, 6) and a == 5
    assert batch["taps"].dtype == torch.float32 and batch["labels"].shape == (b, a, k)
    assert (batch["anchor_pos"][2] == -1).all() and (batch["labels"][2] == -100).all()
    for i, it in enumerate(items):
        n = len(it["input_ids"])
        assert torch.equal(batch["taps"][i, :n], it["taps"].float()) and (batch["taps"][i, n:] == 0).all()
        for j, anchor in enumerate(batch["anchor_pos"][i].tolist()):
            if anchor < 0:
                continue
            assert it["loss_mask"][anchor] and it["loss_mask"][anchor + 1]
            for s in range(k):
                p = anchor + 1 + s
                want = int(it["input_ids"][p]) if p < n and it["loss_mask"][p] else -100
                assert batch["labels"][i, j, s] == want


def _drafter_and_loss(kind, target):
    if kind == "flow":
        from flashmap_ext.drafters.flashmap import FlashMapDrafter
        from flashmap_ext.train.flow import flow_loss
        d = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4, two_time=False)
        d.reset_parameters(zero_init=False)  # adaLN-Zero would make the output ignore the memory
        return d, flow_loss
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.train.dflash import dflash_loss
    return DFlashDrafter.for_target(target, num_hidden_layers=1, block_size=5, mask_token_id=0), dflash_loss


@pytest.mark.parametrize("kind", ["flow", "dflash"])
def test_block_loss_sees_memory_strictly_before_its_anchor(tiny_target, kind):
    drafter, loss_fn = _drafter_and_loss(kind, tiny_target)
    t, anchors = 12, [5, 8]
    ids = torch.randint(0, 111, (2, t))
    mask = torch.ones(t, dtype=torch.bool)
    feat = len(drafter.target_layer_ids) * tiny_target.config.hidden_size
    items = [{"input_ids": ids[i], "loss_mask": mask, "taps": torch.randn(t, feat)} for i in range(2)]
    batch = collate(items, num_anchors=1, block_size=4)
    batch["anchor_pos"] = torch.tensor([[anchors[0]], [anchors[1]]])
    batch["labels"] = torch.stack([block_labels(ids[i], mask, batch["anchor_pos"][i], 4) for i in range(2)])

    def loss(taps):
        return loss_fn(drafter, {**batch, "taps": taps}, torch.Generator().manual_seed(5))[0]
    base = loss(batch["taps"])
    later = batch["taps"].clone()
    for row, a in enumerate(anchors):
        later[row, a:] = torch.randn_like(later[row, a:]) * 10  # the anchor's own taps and everything after
    torch.testing.assert_close(loss(later), base, rtol=0, atol=1e-6)
    earlier = batch["taps"].clone()
    earlier[1, anchors[1] - 1] += 3.0  # the last position of row 1's memory
    assert (loss(earlier) - base).abs() > 1e-4
