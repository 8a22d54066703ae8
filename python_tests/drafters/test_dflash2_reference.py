"""DFlash2 against `speculators`' reference (speculators==0.9.0): a random reference drafter saved in its
own layout, loaded by ours; both run the same taps. Per block: the unary logits agree (fp32 to 1e-4, bf16
within 1.5× the reference's own bf16 error) and the selector's chains are equal, through our training
forward and through our drafting from a memory. Skipped, in one line, when the reference is not installed.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_qwen3
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from support.dflash2_reference import REFERENCE, build_reference, reference, reference_blocks, reference_chain

if reference() is None:
    pytest.skip(f"{REFERENCE} not installed (make test installs it with --no-deps)", allow_module_level=True)

VARIANTS = {
    "full": {},
    "sliding-bidirectional": {"layer_types": ["sliding_attention", "full_attention"], "window": 5},
    "sliding-causal": {"layer_types": ["full_attention", "sliding_attention"], "window": 6, "non_causal": False},
}
TAPS = (1, 3)  # the reference's ids: HF hidden_states[1], [3] = outputs of our layers 0 and 2
T, ANCHORS = 40, 6


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def load_pair(target, tmp_path, name, dtype=torch.float32):
    ref = build_reference(target, taps=TAPS, **VARIANTS[name])
    ref.save_pretrained(str(tmp_path / name))
    ours = DFlash2Drafter.from_pretrained(tmp_path / name, target, dtype=dtype).eval()
    return ref.to(dtype), ours


def inputs(target, dtype=torch.float32):
    ids = torch.randint(0, 110, (1, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    return ids, torch.cat([hs[i] for i in TAPS], -1).to(dtype)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matches_the_reference_fp32(name, target, tmp_path):
    ref, ours = load_pair(target, tmp_path, name)
    assert ours.config.target_layer_ids == tuple(i - 1 for i in TAPS)
    ids, taps = inputs(target)
    torch.manual_seed(11)
    with torch.no_grad():
        anchors, ref_hidden, ref_logits = reference_blocks(ref, taps, ids, ANCHORS)
        train = ours.forward_train(taps, ids, anchors[None])[0]
    assert (train - ref_logits[:, 1:]).abs().max().item() <= 1e-4
    reranked = 0
    for a, pos in enumerate(anchors.tolist()):
        want = reference_chain(ref, ref_hidden[a], ref_logits[a], int(ids[0, pos]))
        memory = ours.new_memory(1)
        ours.extend_memory(memory, ids[:, :pos], taps[:, :pos])
        tokens, logits = ours.draft_with_logits(memory, ids[0, pos:pos + 1], num_tokens=ours.num_draft_tokens,
                                                position=torch.tensor([pos]))
        assert (logits[0] - ref_logits[a, 1:]).abs().max().item() <= 1e-4, f"block at {pos}"
        assert tokens[0].tolist() == want, f"block at {pos}"
        reranked += want != ref_logits[a, 1:].argmax(-1).tolist()
    assert reranked > 0  # the selector changed some chain: the comparison is not the unary argmax's


@pytest.mark.parametrize("name", ["full", "sliding-bidirectional"])
def test_matches_the_reference_bf16(name, target, tmp_path):
    """bf16 on both sides, each against the fp32 reference: our logits' largest error is within 1.5× the
    reference's own bf16 error (+0.02 absolute)."""
    ref32, _ = load_pair(target, tmp_path, name)
    ids, taps = inputs(target)
    torch.manual_seed(11)
    with torch.no_grad():
        anchors, _, exact = reference_blocks(ref32, taps, ids, ANCHORS)
    ref, ours = load_pair(target, tmp_path, name, torch.bfloat16)
    torch.manual_seed(11)
    with torch.no_grad():
        same, _, ref_logits = reference_blocks(ref, taps.bfloat16(), ids, ANCHORS)
        train = ours.forward_train(taps.bfloat16(), ids, anchors[None])[0].float()
    assert torch.equal(same, anchors)
    ref_err = (ref_logits[:, 1:].float() - exact[:, 1:]).abs().max().item()
    our_err = (train - exact[:, 1:]).abs().max().item()
    assert our_err <= 1.5 * ref_err + 0.02, (our_err, ref_err)


def test_tap_ids_convert_both_ways(target, tmp_path):
    """Our DFlash2 saved in speculators' layout stores tap ids + 1 and loads back identical."""
    ref, ours = load_pair(target, tmp_path, "full")
    ours.save_pretrained(tmp_path / "spec", layout="speculators")
    back = DFlash2Drafter.from_pretrained(tmp_path / "spec", target)
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["aux_hidden_state_layer_ids"] == list(TAPS)
    assert back.config == ours.config
    for k, v in ours.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    model_cls, config_cls, _ = reference()
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    again = model_cls(config_cls.model_validate(cfg))  # the reference reads our config.json as its own
    again.load_state_dict(load_file(tmp_path / "spec" / "model.safetensors"), strict=False)
    own = {k: v for k, v in ref.state_dict().items() if k in again.state_dict() and "verifier" not in k
           and not k.startswith(("embed_tokens", "lm_head"))}
    for k, v in own.items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_selector_loss_matches_the_reference(target, tmp_path):
    """Our selector CE (train/dflash.py) = the reference's: its training candidates (the label swapped in
    for the last one when the top-k misses it) re-scored by its selector, cross-entropy per position."""
    import torch.nn.functional as F
    from speculators.models.dflash2.metrics import selector_training_candidates

    from flashmap_ext.train.dflash import selector_ce
    ref, ours = load_pair(target, tmp_path, "full")
    g = torch.Generator().manual_seed(5)
    logits, hidden = torch.randn(30, 111, generator=g) * 3, torch.randn(30, 64, generator=g)
    labels, prev = torch.randint(0, 111, (30,), generator=g), torch.randint(0, 111, (30,), generator=g)
    with torch.no_grad():
        cands, where, found = selector_training_candidates(logits.topk(5).indices, labels)
        want = F.cross_entropy(ref.candidate_selector.score_candidates(logits, hidden, prev, cands), where,
                               reduction="none")
        got, _ = selector_ce(ours.candidate_selector, logits, hidden, prev, labels)
    assert 0 < int(found.sum()) < 30
    assert (got - want).abs().max().item() <= 1e-5
