"""The committed checkpoints load unchanged and draft the same tokens on fixed inputs.

A regression oracle across refactors: each checkpoint kind (FlashMap flow map, FlashMap flow model,
DFlash, DFlash2, EAGLE-3 with a frozen head) is loaded onto a fixed random target of the real target's shape
(Qwen2.5-0.5B: 24 layers, d = 896, V = 151,936; tiny MLPs, tied head) and drafts from fixed prompt
taps; the tokens must equal those recorded in `fixtures/committed_checkpoints.json` by the code of
the commit that added this test. Record again (only after an intended change of the drafts) with
`python python_tests/drafters/test_committed_checkpoints.py --record`.
Skipped when a checkpoint's weights are not in the working tree (`make checkpoints` materialises them).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "committed_checkpoints.json"
KINDS = {"flashmap": "flashmap-map-qwen2.5-coder-0.5b", "flashmap-flow": "flashmap-flow-qwen2.5-coder-0.5b",
         "dflash": "dflash-qwen2.5-coder-0.5b", "dflash2": "dflash2-qwen2.5-coder-0.5b",
         "eagle3": "eagle3-qwen2.5-coder-0.5b"}
PROMPT_LEN, NEW_TOKENS = 24, 12


def _weights(kind: str) -> Path:
    return ROOT / "checkpoints" / KINDS[kind] / "model.safetensors"


def random_target():
    """Qwen2 of the committed checkpoints' target shape; every weight from one seeded generator."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=64, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, rope_theta=1_000_000.0)
    model = Qwen2ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "embed" in name else 0.05))
    return model.eval()


def prompt() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, 151_000, (1, PROMPT_LEN), generator=gen)


def load(kind: str, target):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    cls = {"dflash": DFlashDrafter, "dflash2": DFlash2Drafter, "eagle3": Eagle3Drafter}.get(kind, FlashMapDrafter)
    return cls.from_pretrained(_weights(kind).parent, target.model, dtype=torch.float32).eval()


def drafts(kind: str, target) -> dict:
    """What the checkpoint drafts from the prompt's taps, and what the loop does with it (T = 0 and T > 0)."""
    from flashmap_ext import draft_block
    from flashmap_ext.speculate import TreeSpec, generate
    drafter, ids = load(kind, target), prompt()
    with torch.inference_mode():
        taps = target.forward(ids, target.new_cache(), tap_layer_ids=drafter.target_layer_ids).taps
        memory = drafter.new_memory(1, torch.device("cpu"))
        drafter.extend_memory(memory, ids[:, :-1], taps[:, :-1])
        anchor, seed, position = ids[:, -1], torch.tensor([11]), torch.tensor([PROMPT_LEN - 1])
        out = {"draft": drafter.draft(memory, anchor, num_tokens=drafter.num_draft_tokens, seed=seed,
                                      position=position).tolist()}
        if kind.startswith("flashmap"):
            for steps in (1, 2):
                out[f"steps{steps}"] = draft_block(drafter, memory, anchor, steps=steps, seed=seed,
                                                   position=position).tokens.tolist()
        if kind == "eagle3":
            tree = drafter.draft_tree(memory, anchor, position, depth=4, topk=3, num_nodes=8)
            out["tree"] = [tree.tokens.tolist(), tree.parents.tolist()]
    for temperature in (0.0, 0.8):
        res = generate(target, drafter, ids, NEW_TOKENS, temperature=temperature, seed=3)
        out[f"generate_T{temperature}"] = [res.tokens, res.stats.accepted]
    if kind == "eagle3":
        res = generate(target, drafter, ids, NEW_TOKENS, tree=TreeSpec(4, 3, 8))
        out["tree_generate"] = [res.tokens, res.stats.accepted]
    if kind == "dflash2":  # the selector's tree, as the bench's "DFlash2 selector 16" row
        from flashmap_ext.draft_shapes.block_tree import SelectorTreeDrafter
        res = generate(target, SelectorTreeDrafter(drafter), ids, NEW_TOKENS,
                       tree=TreeSpec(drafter.num_draft_tokens, 4, 16))
        out["tree_generate"] = [res.tokens, res.stats.accepted]
    return out


@pytest.fixture(scope="module")
def target():
    from flashmap_ext.target import Target
    return Target(random_target())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_committed_checkpoint_drafts_recorded_tokens(kind, target):
    if not _weights(kind).is_file():
        pytest.skip(f"{_weights(kind)} not in the working tree (make checkpoints)")
    expected = json.loads(FIXTURE.read_text())[kind]
    got = json.loads(json.dumps(drafts(kind, target)))  # tuples -> lists, as recorded
    assert got == expected, f"{kind}: the committed checkpoint drafts differently than recorded"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    from flashmap_ext.target import Target
    torch.set_num_threads(1)
    t = Target(random_target())
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({k: drafts(k, t) for k in sorted(KINDS)}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")
