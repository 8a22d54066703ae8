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
