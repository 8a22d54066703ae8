"""DFlash2 without the reference (test_dflash2_reference.py holds the parity tests): its convolution and
selector paths against plain float64 loops and brute force, the training forward against drafting, the
two checkpoint layouts and `flashmap convert` between them, and what is refused, in one line naming the field.
"""
import itertools
import json

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.cli import main
from flashmap_ext.drafters.dflash2 import DFlash2Config, DFlash2Drafter
from flashmap_ext.drafters.dflash2.conv import grouped_dynamic_conv
from flashmap_ext.drafters.dflash2.selector import CandidateSelector
from flashmap_ext.target import Target

TAPS = [0, 2]
SLIDING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5}


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def drafter(target, seed=0, **changes):
    """A random DFlash2 drafter for `target`, its convolutions random too (they start as identities)."""
    torch.manual_seed(seed)
    d = DFlash2Drafter.for_target(target, mask_token_id=110, num_hidden_layers=2, block_size=5, selector_rank=8,
                                  selector_top_k=6, target_layer_ids=TAPS, **changes).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "conv" in name:
                p.copy_(torch.randn_like(p) * 0.3)
            if "selector" in name:
                p.copy_(torch.randn_like(p))
    return d


def test_conv_matches_a_float64_loop():
    g = torch.Generator().manual_seed(0)
    bs, d, groups, kernel = 4, 8, 2, 3
    x = torch.randn(2, 3 * bs, d, generator=g, dtype=torch.float64)
    delta = torch.randn(2, 3 * bs, kernel, groups, generator=g, dtype=torch.float64)
    base = torch.randn(kernel, d, generator=g, dtype=torch.float64)
    want = torch.zeros_like(x)
    for b, i, c, t in itertools.product(range(2), range(3 * bs), range(d), range(kernel)):
        if i % bs >= t:  # causal inside the block: never a slot of the previous block
            want[b, i, c] += x[b, i - t, c] * (base[t, c] + delta[b, i, t, c // (d // groups)])
    assert torch.allclose(grouped_dynamic_conv(x, delta, base, bs), want, atol=1e-12)


def test_selector_paths_match_loops_and_brute_force():
    torch.manual_seed(1)
    sel = CandidateSelector(rows=12, hidden_size=6, rank=3, top_k=4, std=1.0).double()
    unary = torch.randn(3, 4, 12, dtype=torch.float64) * 2
    hidden = torch.randn(3, 4, 6, dtype=torch.float64)
    anchor = torch.tensor([2, 11, -100])

    def edge(b, s, prev, c):
        ctx = sel.predecessor_codebook[prev] * (hidden[b, s] @ sel.hidden_projection.weight.T) if prev >= 0 else 0
        return float(unary[b, s, c] + (ctx * sel.successor_codebook[c]).sum())
    greedy, best = sel.greedy_path(unary, hidden, anchor), sel.best_path(unary, hidden, anchor)
    for b in range(3):
        cands = [unary[b, s].topk(4).indices.tolist() for s in range(4)]
        prev, want = int(anchor[b]), []
        for s in range(4):
            prev = max(cands[s], key=lambda c: edge(b, s, prev, c))
            want.append(prev)
        assert greedy[b].tolist() == want
        paths = itertools.product(*cands)
        total = {p: sum(edge(b, s, ([int(anchor[b])] + list(p))[s], p[s]) for s in range(4)) for p in paths}
        assert tuple(best[b].tolist()) == max(total, key=total.get)


@pytest.mark.parametrize("changes", [{}, SLIDING, {**SLIDING, "is_causal": False, "window_from_anchor": True},
                                     {**SLIDING, "window_from_anchor": True}],
                         ids=["full", "sliding-per-query", "sliding-from-anchor", "sliding-causal-from-anchor"])
def test_training_forward_matches_drafting(changes, target):
    d = drafter(target, **changes)
    ids = torch.randint(0, 110, (1, 30), generator=torch.Generator().manual_seed(6))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=TAPS).taps
    anchors = torch.tensor([[3, 11, 19, 24]])
    train = d.forward_train(taps, ids, anchors)
    for a, pos in enumerate(anchors[0].tolist()):
        memory = d.new_memory(1)
        d.extend_memory(memory, ids[:, :pos], taps[:, :pos])
        _, logits = d.draft_with_logits(memory, ids[0, pos:pos + 1], num_tokens=4, position=torch.tensor([pos]))
        assert (train[:, a] - logits).abs().max().item() <= 1e-4


def test_window_from_anchor_changes_the_drafts(target):
    """The sliding-window rule is not vacuous: counted from the anchor, the block reads other context."""
    ids = torch.randint(0, 110, (1, 30), generator=torch.Generator().manual_seed(7))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=TAPS).taps
    out = []
    for changes in (SLIDING, {**SLIDING, "window_from_anchor": True}):
        d = drafter(target, **changes)
        out.append(d.forward_train(taps, ids, torch.tensor([[20]])))
    assert (out[0] - out[1]).abs().max() > 1e-3


def test_layouts_and_convert_round_trip(target, tmp_path):
    d = drafter(target, **SLIDING, is_causal=False, window_from_anchor=True)
    d.save_pretrained(tmp_path / "spec", layout="speculators")
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert spec["speculators_model_type"] == "dflash2" and spec["aux_hidden_state_layer_ids"] == [1, 3]
    assert spec["sliding_window_non_causal"] is True and spec["transformer_layer_config"]["num_hidden_layers"] == 2
    assert main(["convert", str(tmp_path / "spec"), str(tmp_path / "zlab"), "--to", "dflash2"]) == 0
    assert main(["convert", str(tmp_path / "zlab"), str(tmp_path / "back"), "--to", "speculators"]) == 0
    zlab = json.loads((tmp_path / "zlab" / "config.json").read_text())
    assert zlab["architectures"] == ["DFlash2DraftModel"] and zlab["dflash_config"]["selector_rank"] == 8
    for path in ("spec", "zlab", "back"):
        loaded = DFlash2Drafter.from_pretrained(tmp_path / path, target)
        assert loaded.config == d.config, path
        for k, v in d.state_dict().items():
            assert torch.equal(v, loaded.state_dict()[k]), (path, k)


def test_export_for_vllm(target, tmp_path):
    from flashmap_ext.integrations.vllm import export_dflash2, speculative_config
    drafter(target).save_pretrained(tmp_path / "d")
    out = export_dflash2(tmp_path / "d", tmp_path / "v")
    assert speculative_config(out)["num_speculative_tokens"] == 4
    drafter(target, **SLIDING, window_from_anchor=True).save_pretrained(tmp_path / "w")
    with pytest.raises(NotImplementedError, match="window_from_anchor"):
        export_dflash2(tmp_path / "w", tmp_path / "v2")


def _speculators(tmp_path, target, **changes):
    drafter(target).save_pretrained(tmp_path / "s", layout="speculators")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("layer."):
            cfg["transformer_layer_config"][key[6:]] = value
        else:
            cfg[key] = value
    (tmp_path / "s" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "s"


@pytest.mark.parametrize("changes, field", [
    ({"sample_from_anchor": True}, "sample_from_anchor"),
    ({"draft_vocab_size": 50}, "draft_vocab_size"),
    ({"conv_group_size": 5}, "conv_group_size"),
    ({"conv_kernel_size": 9}, "conv_kernel_size"),
    ({"selector_top_k": 500}, "selector_top_k"),
    ({"target_hidden_size": 32}, "target_hidden_size"),
    ({"layer.hidden_act": "gelu"}, "hidden_act"),
    ({"mask_token_id": None}, "mask_token_id"),
])
def test_refused_in_one_line_naming_the_field(changes, field, target, tmp_path):
    path = _speculators(tmp_path, target, **changes)
    with pytest.raises(ValueError) as err:
        DFlash2Drafter.from_pretrained(path, target)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_convert_refusals(target, tmp_path, capsys):
    d = DFlash2Drafter.for_target(target, mask_token_id=110, num_hidden_layers=1, block_size=4, selector_rank=4,
                                  selector_top_k=4, target_layer_ids=TAPS, draft_vocab_size=40)
    d.save_pretrained(tmp_path / "dv")
    drafter(target).save_pretrained(tmp_path / "d")
    for argv, needle in ((["dv", "o1", "--to", "speculators"], "draft_vocab_size"),
                         (["d", "o2", "--to", "dflash"], "DFlash2")):
        assert main(["convert", str(tmp_path / argv[0]), str(tmp_path / argv[1]), *argv[2:]]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, err


def test_config_checks():
    base = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                vocab_size=111, mask_token_id=110, target_layer_ids=(0,), num_target_layers=4, block_size=4)
    with pytest.raises(ValueError, match="selector_rank"):
        DFlash2Config(**base, selector_rank=0)
    once = DFlash2Config.from_hf_dict(DFlash2Config(**base, conv_kernel_size=3, selector_top_k=7).to_hf_dict())
    assert (once.conv_kernel_size, once.selector_top_k) == (3, 7)
    assert DFlash2Config.from_hf_dict(once.to_hf_dict()) == once


# --- training --------------------------------------------------------------------------------------------
def _batch(d, target, t=20, seed=3):
    ids = torch.randint(0, 110, (2, t), generator=torch.Generator().manual_seed(seed))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=TAPS).taps
    anchors = torch.tensor([[0, 4, 9, 13], [1, 2, 10, -1]])
    k = d.num_draft_tokens
    pos = anchors[..., None] + 1 + torch.arange(k)
    labels = torch.where((pos < t) & (anchors[..., None] >= 0), ids.gather(1, pos.clamp(0, t - 1).flatten(1))
                         .view_as(pos), -100)
    return {"input_ids": ids, "taps": taps, "anchor_pos": anchors, "labels": labels}


def test_loss_is_dflash_plus_the_selector_term_by_hand(target):
    """dflash_loss of a DFlash2 drafter = the unary weighted CE + the selector's weighted CE over its
    top-k candidates (the label swapped in for the last one when missing), against a float64 loop."""
    import math

    from flashmap_ext.train.dflash import dflash_loss
    d = drafter(target).double()
    sel = d.candidate_selector
    sel.top_k = 3  # small enough that some labels fall outside the top-k
    batch = _batch(d, target)
    batch["taps"] = batch["taps"].double()
    batch["labels"][0, 1, 2] = -100
    loss, metrics = dflash_loss(d, batch, gamma=2.0, anchor_chunk=3, selector_weight=0.5)
    hidden = d.forward_train_hidden(batch["taps"], batch["input_ids"], batch["anchor_pos"])
    logits = d.vocab_logits(hidden)
    unary = [0.0, 0.0]
    selector = [0.0, 0.0]
    missed = 0
    for b, a, k in itertools.product(range(2), range(4), range(4)):
        y = int(batch["labels"][b, a, k])
        if y < 0:
            continue
        w = math.exp(-k / 2.0)
        unary[0] -= w * float(torch.log_softmax(logits[b, a, k], -1)[y])
        unary[1] += w
        prev = int(batch["input_ids"][b, batch["anchor_pos"][b, a]]) if k == 0 else int(batch["labels"][b, a, k - 1])
        cands = logits[b, a, k].topk(3).indices.tolist()
        if y not in cands:
            cands[-1], missed = y, missed + 1
        ctx = sel.predecessor_codebook[prev] * (hidden[b, a, k] @ sel.hidden_projection.weight.T) if prev >= 0 else 0
        scores = torch.stack([logits[b, a, k, c] + (ctx * sel.successor_codebook[c]).sum() for c in cands])
        selector[0] -= w * float(torch.log_softmax(scores, -1)[cands.index(y)])
        selector[1] += w
    assert missed > 0
    want = unary[0] / unary[1] + 0.5 * selector[0] / selector[1]
    assert loss.item() == pytest.approx(want, rel=1e-6)  # the loss runs its logits in fp32
    assert metrics["selector_loss"] == pytest.approx(selector[0] / selector[1], rel=1e-6)


def test_loss_decreases_on_tiny_overfit(target):
    from flashmap_ext.train.dflash import dflash_loss
    d = drafter(target).train()
    batch = _batch(d, target)
    opt = torch.optim.Adam(d.parameters(), lr=5e-3)
    first = None
    for _ in range(25):
        loss, metrics = dflash_loss(d, batch)
        first = first or metrics
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert metrics["loss"] < 0.3 * first["loss"] and metrics["selector_loss"] < 0.5 * first["selector_loss"]
    assert metrics["acc"] > first["acc"] + 0.3
    assert d.candidate_selector.successor_codebook.grad.abs().sum() > 0
    assert target.lm_head.weight.grad is None


def test_train_dflash2_command_on_tiny_random(tmp_path, monkeypatch):
    """`flashmap train dflash2` end to end on the tiny random target: features, a few steps, the drafter
    written, loaded back and drafting (its metrics carry the selector loss), parameters as configured."""
    monkeypatch.setenv("FLASHMAP_DEBUG", "1")
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {w}"},
                                                     {"role": "assistant", "content": "?"}]}) + "\n"
                            for w in ("one", "two", "three", "four")))
    common = ["--target", "tiny-random", "--no-progress"]
    assert main(["data", "regenerate", *common, "--data", str(conv), "--out", str(tmp_path / "r.jsonl"),
                 "--max-new-tokens", "24", "--batch-size", "4"]) == 0
    assert main(["features", *common, "--data", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "f")]) == 0
    out = tmp_path / "d2"
    assert main(["train", "dflash2", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
                 "--batch-size", "2", "--out", str(out), "--steps", "12", "--mask-token-id", "0",
                 "--selector-rank", "4", "--selector-top-k", "5", "--log-every", "1", "--lr", "3e-3"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "selector_loss" in lines[0] and lines[-1]["loss"] < lines[0]["loss"]
    cfg = json.loads((out / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["selector_rank"] == 4
    assert main(["generate", "--target", "tiny-random", "--drafter", str(out / "drafter"), "--prompt", "say one",
                 "--max-new-tokens", "8"]) == 0


def test_bench_rows_of_a_dflash2_checkpoint(target, tmp_path):
    """`flashmap bench --dflash <DFlash2 checkpoint> --shapes`: its chain, best-path chain and its top-k and
    selector trees at 16 and 32 nodes."""
    from flashmap_ext.bench.methods import build_methods
    from flashmap_ext.draft_shapes.block_tree import SelectorTreeDrafter
    drafter(target).save_pretrained(tmp_path / "d")
    rows = build_methods(Target(target), torch.float32, None, str(tmp_path / "d"), None, peers=False, shapes=True)
    names = [m.name for m in rows]
    assert names[:3] == ["AR", "DFlash2", "DFlash2 best path"] and rows[2].drafter.path == "best"
    for n in (16, 32):
        row = rows[names.index(f"DFlash2 selector {n}")]
        assert isinstance(row.drafter, SelectorTreeDrafter) and row.tree.num_nodes == n
        assert f"DFlash2 top-k {n}" in names


def test_a_missing_mask_token_names_the_dflash2_flag(target):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    for cls, stage in ((DFlash2Drafter, "flashmap train dflash2:"), (DFlashDrafter, "flashmap train dflash:")):
        with pytest.raises(ValueError, match=f"no tokenizer given.*{stage} --mask-token-id"):
            cls.for_target(target, num_hidden_layers=1, block_size=4)
