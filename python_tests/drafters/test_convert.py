"""`flashmap convert`: round trips checked against z-lab's reference code and the EAGLE-3 oracle chain."""
import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_dflash2_drafter import TAPS as D2_TAPS
from test_dflash2_drafter import drafter as dflash2_drafter
from test_dflash_drafter import MASK, TAPS, write_released
from test_dflash_reference import VARIANTS, assert_same_rounds, reference, write_variant
from test_eagle3_drafter import TAPS as E3_TAPS
from test_eagle3_drafter import (
    _ctx,
    assert_chain_like_oracle,
    float64_chain,
    oracle_chain,
    specforge_weights,
    write_specforge,
)
from test_eagle3_formats import write_speculators

from conftest import tiny_qwen3
from flashmap_ext.cli import main
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from flashmap_ext.drafters.eagle3 import Eagle3Drafter


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, target):
    path = tmp_path_factory.mktemp("target")
    target.save_pretrained(path)
    return path


def _taps(target, ids):
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    from dflash.model import extract_context_feature
    return extract_context_feature(hs, TAPS)


@pytest.mark.parametrize("name", ["full", "causal", "sliding", "rope-yarn", "gemma-scales"])
def test_dflash_roundtrip_drafts_like_the_reference(name, target, tmp_path):
    src = write_variant(tmp_path / name, VARIANTS[name])
    assert main(["convert", str(src), str(tmp_path / "out"), "--to", "dflash"]) == 0
    ids = torch.randint(0, MASK, (1, 40), generator=torch.Generator().manual_seed(7))
    feats = _taps(target, ids)
    # z-lab's code on the converted files == our drafter on the source files (and the reverse)
    assert_same_rounds(reference(tmp_path / "out"), DFlashDrafter.from_pretrained(src, target), target, ids, feats)
    assert_same_rounds(reference(src), DFlashDrafter.from_pretrained(tmp_path / "out", target), target, ids, feats)


def test_dflash_from_vllm_numbering_to_zlab(target, target_dir, tmp_path):
    """A file naming its taps only vLLM's way (+1) and without num_target_layers converts to z-lab's
    format (ids −1, num_target_layers from --target), which z-lab's code loads and drafts with alike."""
    src = write_released(tmp_path / "vllm", dflash_config={"mask_token_id": MASK},
                         eagle_aux_hidden_state_layer_ids=[i + 1 for i in TAPS])
    cfg = json.loads((src / "config.json").read_text())
    del cfg["num_target_layers"]
    (src / "config.json").write_text(json.dumps(cfg))
    dst = tmp_path / "zlab"
    assert main(["convert", str(src), str(dst), "--to", "dflash", "--target", str(target_dir)]) == 0
    out = json.loads((dst / "config.json").read_text())
    assert out["dflash_config"]["target_layer_ids"] == TAPS and out["num_target_layers"] == 4
    ids = torch.randint(0, MASK, (1, 40), generator=torch.Generator().manual_seed(8))
    assert_same_rounds(reference(dst), DFlashDrafter.from_pretrained(src, target), target, ids, _taps(target, ids))


def test_dflash_draft_vocab_stores_the_target_head_rows(target, target_dir, tmp_path):
    """With a draft vocabulary, --to dflash writes the target's LM-head rows of it as `lm_head.weight`
    (vLLM's DFlash drafter owns them; vLLM's export_dflash is the same writer), keeps every weight, and
    our loader reads the file back, refusing a head that is not the target's rows."""
    torch.manual_seed(3)
    ours = DFlashDrafter.for_target(target, mask_token_id=MASK, num_hidden_layers=1, block_size=4,
                                    target_layer_ids=TAPS, draft_vocab_size=20, dtype=torch.float32)
    vocab = torch.randperm(MASK, generator=torch.Generator().manual_seed(5))[:20]
    ours.set_draft_vocab(vocab)
    ours.save_pretrained(tmp_path / "ours")
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "no"), "--to", "dflash"]) == 2
    dst = tmp_path / "engine"
    assert main(["convert", str(tmp_path / "ours"), str(dst), "--to", "dflash", "--target", str(target_dir)]) == 0
    out = load_file(dst / "model.safetensors")
    assert set(out) == set(ours.state_dict()) | {"lm_head.weight"}
    assert all(torch.equal(out[k], v) for k, v in ours.state_dict().items())
    assert torch.equal(out["lm_head.weight"], target.lm_head.weight[vocab.sort().values])
    again = DFlashDrafter.from_pretrained(dst, target)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in ours.state_dict().items())
    out["lm_head.weight"] = out["lm_head.weight"].flip(0)
    save_file(out, str(dst / "model.safetensors"))
    with pytest.raises(NotImplementedError, match="lm_head.weight is not the target's"):
        DFlashDrafter.from_pretrained(dst, target)


def test_eagle3_frozen_head_to_engines(tmp_path, target_dir):
    """Our frozen-head EAGLE-3 -> speculators and SpecForge formats: the head is stored, the drafts equal."""
    e3_target = tiny_qwen3(hidden_size=64, num_layers=6)
    e3_dir = tmp_path / "e3-target"
    e3_target.save_pretrained(e3_dir)
    ours = Eagle3Drafter.for_target(e3_target, draft_ids=torch.arange(3, 43), dtype=torch.float32,
                                    intermediate_size=16, target_layer_ids=E3_TAPS, frozen_lm_head=True)
    ours.save_pretrained(tmp_path / "ours")
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "x"), "--to", "speculators"]) == 2
    ids, taps = _ctx(7)
    want = float64_chain(ours, ids, taps, 6, 4)
    assert_chain_like_oracle(ours, want, ids, taps, 6)
    for fmt in ("speculators", "specforge"):
        dst = tmp_path / fmt
        assert main(["convert", str(tmp_path / "ours"), str(dst), "--to", fmt, "--target", str(e3_dir)]) == 0
        assert "lm_head.weight" in load_file(dst / "model.safetensors")
        assert_chain_like_oracle(Eagle3Drafter.from_pretrained(dst, e3_target), want, ids, taps, 6)


def test_eagle3_speculators_to_specforge(tmp_path):
    """SpecForge-format files convert to speculators and back without change; speculators-only options
    cannot go to SpecForge's format."""
    e3_target = tiny_qwen3(hidden_size=64, num_layers=6)
    src = write_specforge(tmp_path / "sf", num_draft_tokens=4)
    assert main(["convert", str(src), str(tmp_path / "spec"), "--to", "speculators"]) == 0
    assert main(["convert", str(tmp_path / "spec"), str(tmp_path / "back"), "--to", "specforge"]) == 0
    assert "num_target_layers" not in json.loads((tmp_path / "back" / "config.json").read_text())  # not invented
    ids, taps = _ctx(9)
    want = oracle_chain(specforge_weights(), e3_target, ids[0], taps[0, :8], 4)
    for path in (src, tmp_path / "back"):
        assert_chain_like_oracle(Eagle3Drafter.from_pretrained(path, e3_target), want, ids, taps, 8)
    flagged = write_speculators(tmp_path / "flagged")
    assert main(["convert", str(flagged), str(tmp_path / "no"), "--to", "specforge"]) == 2


def test_refusals_are_one_line_errors(tmp_path, capsys):
    gated = tmp_path / "gated"  # a FlashMap drafter the vLLM plugin does not serve either
    gated.mkdir()
    config = json.loads((pathlib.Path(__file__).resolve().parents[2] / "checkpoints" / "flashmap-map-qwen2.5-coder-0.5b"
                         / "config.json").read_text())
    (gated / "config.json").write_text(json.dumps({**config, "tau_gated_input": True}))
    cases = [
        ([str(gated), str(tmp_path / "h"), "--to", "dflash"], "ungated); it runs in flashmap's own decoder"),
        (["checkpoints/flashmap-map-qwen2.5-coder-0.5b", str(tmp_path / "a"), "--to", "dflash"],
         "export_flashmap(src, dst, unwindowed=True)"),
        ([str(write_released(tmp_path / "d")), str(tmp_path / "b"), "--to", "speculators"], "--to dflash"),
        ([str(write_specforge(tmp_path / "e")), str(tmp_path / "c"), "--to", "dflash"], "--to specforge"),
        ([str(write_released(tmp_path / "d2", architectures=["DFlash2DraftModel"])), str(tmp_path / "f"),
          "--to", "dflash"], "DFlash2"),
        ([str(tmp_path / "d"), str(tmp_path / "d"), "--to", "dflash"], "already holds"),
        ([str(write_released(tmp_path / "w", dflash_config={"mask_token_id": MASK, "target_layer_ids": TAPS,
                                                            "context_window": 8})), str(tmp_path / "g"),
          "--to", "dflash"], "pass --unwindowed"),
    ]
    for argv, needle in cases:
        assert main(["convert", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, (argv, err)


def test_dflash_unwindowed_drops_our_window_and_drafts_like_the_reference(target, tmp_path):
    """--unwindowed: the released file has no context_window, and z-lab's code on it drafts as our drafter
    with the window lifted (load_drafter(context_window=None)) on a context longer than the window."""
    from flashmap_ext.drafters.load import load_drafter
    src = write_released(tmp_path / "w", dflash_config={"mask_token_id": MASK, "target_layer_ids": TAPS,
                                                        "context_window": 8})
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--to", "dflash", "--unwindowed"]) == 0
    assert "context_window" not in json.loads((out / "config.json").read_text())["dflash_config"]
    ids = torch.randint(0, MASK, (1, 40), generator=torch.Generator().manual_seed(7))
    ours = load_drafter(str(src), target, context_window=None)
    assert ours.config.context_window is None
    assert_same_rounds(reference(out), ours, target, ids, _taps(target, ids))


def _dflash2_drafts(drafter, ids, taps, pos):
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, ids[:, :pos], taps[:, :pos])
    return drafter.draft_with_logits(memory, ids[0, pos:pos + 1], num_tokens=4, position=torch.tensor([pos]))


@pytest.mark.parametrize("to", ["dflash2", "speculators"])
def test_dflash2_window_needs_unwindowed_and_is_dropped_with_it(to, target, tmp_path, capsys):
    """A DFlash2 drafter with a context window: refused in one line naming --unwindowed, as --to dflash;
    with --unwindowed the written config has no window, loads back, drafts as the source on contexts
    within the window and as the source with its window lifted past it."""
    from flashmap_ext.drafters.load import load_drafter
    from flashmap_ext.target import Target
    src = tmp_path / "w"
    dflash2_drafter(target, context_window=12).save_pretrained(src)
    assert main(["convert", str(src), str(tmp_path / "no"), "--to", to]) == 2
    err = capsys.readouterr().err.strip()
    assert "context_window=12" in err and "pass --unwindowed" in err and "\n" not in err, err
    assert not (tmp_path / "no" / "config.json").exists()
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--to", to, "--unwindowed"]) == 0
    assert "context_window" not in (out / "config.json").read_text()
    ours, back = DFlash2Drafter.from_pretrained(src, target), DFlash2Drafter.from_pretrained(out, target)
    assert ours.config.context_window == 12 and back.config.context_window is None
    unlimited = load_drafter(str(src), target, context_window=None)
    ids = torch.randint(0, 110, (1, 30), generator=torch.Generator().manual_seed(7))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=D2_TAPS).taps
    for pos in (5, 12):  # within the window
        (want, want_logits), (got, got_logits) = _dflash2_drafts(ours, ids, taps, pos), _dflash2_drafts(back, ids, taps, pos)
        assert torch.equal(got, want) and torch.allclose(got_logits, want_logits, atol=1e-6), pos
    got, want = _dflash2_drafts(back, ids, taps, 25)[1], _dflash2_drafts(unlimited, ids, taps, 25)[1]
    assert torch.allclose(got, want, atol=1e-6)
    assert (got - _dflash2_drafts(ours, ids, taps, 25)[1]).abs().max() > 1e-3  # the window really masks


def test_export_dflash2_drops_a_window_when_unwindowed(target, tmp_path):
    from flashmap_ext.integrations.vllm import export_dflash2
    dflash2_drafter(target, context_window=12).save_pretrained(tmp_path / "w")
    with pytest.raises(NotImplementedError, match="context_window=12 .* pass unwindowed=True"):
        export_dflash2(tmp_path / "w", tmp_path / "no")
    out = export_dflash2(tmp_path / "w", tmp_path / "v", unwindowed=True)
    assert "context_window" not in json.loads((out / "config.json").read_text())["dflash_config"]
    assert DFlash2Drafter.from_pretrained(out, target).config.context_window is None


def test_speculative_config_refuses_an_unexported_flashmap_checkpoint(tmp_path):
    """`speculative_config` on the committed FlashMap checkpoint (not an export)
    returned num_speculative_tokens 7 (DFlash's block_size − 1) where its export gives 8, without a word."""
    from flashmap_ext.integrations.vllm import speculative_config
    config = json.loads((pathlib.Path(__file__).resolve().parents[2] / "checkpoints" / "flashmap-map-qwen2.5-coder-0.5b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not an export for vLLM: run export_flashmap"):
        speculative_config(tmp_path)
    exported = {"architectures": ["DFlashFlashMapDrafter"], "model_type": "qwen3", "block_size": 8}
    (tmp_path / "config.json").write_text(json.dumps(exported))
    assert speculative_config(tmp_path)["num_speculative_tokens"] == 8


def test_export_names_a_missing_checkpoint_in_one_line(tmp_path):
    from flashmap_ext.drafters.common.checkpoint import CheckpointError
    from flashmap_ext.integrations.vllm.export import export_flashmap
    with pytest.raises(CheckpointError, match=r"nowhere: no such directory \(expected a drafter checkpoint"):
        export_flashmap(tmp_path / "nowhere", tmp_path / "dst")
