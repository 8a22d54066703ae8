"""DFlash against z-lab's own code: `dflash==0.1.0` (PyPI, installed with --no-deps by `make test`).

Each supported checkpoint variant (full, causal, sliding-window, RoPE scaling, Gemma-style scales, no
`num_target_layers`) is written once as a tiny random checkpoint and loaded by both implementations.
Both then draft over the same target taps through several committed rounds (z-lab's own cache and crop
calls, as in its `dflash_generate`); logits must agree to 1e-5 in fp32 and the drafts exactly.
Unsupported variants must be refused at load with one line naming the field.
"""
import pytest
import torch
import torch.nn.functional as F
from test_dflash_drafter import BLOCK, MASK, TAPS, released_config, write_released

from conftest import tiny_qwen3
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.dflash.config import DFlashConfig
from flashmap_ext.target import Target

try:
    from dflash.model import DFlashDraftModel, _crop_to, _make_cache, extract_context_feature
except ImportError as e:  # fail loudly: the differential test is the point of this file
    raise ImportError("z-lab's reference is missing: `pip install --no-deps dflash==0.1.0` (make test does)") from e

SLIDING2 = ["sliding_attention", "full_attention"]
VARIANTS = {
    "full": {},
    "causal": {"is_causal": True},
    "sliding": {"layer_types": SLIDING2, "sliding_window": 4, "use_sliding_window": True},
    "sliding-bidirectional": {"layer_types": SLIDING2, "sliding_window": 3, "use_sliding_window": True,
                              "is_causal": False},
    "rope-linear": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "rope-yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
    "rope-llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "gemma-scales": {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS,
                                       "input_embedding_scale": 8.0, "output_multiplier": 0.5,
                                       "final_logit_softcapping": 3.0}},
    "no-num-target-layers": {"num_target_layers": None},
}
ROUNDS = [3, 1, BLOCK, 2, 4, 1, 5]  # tokens committed per round (accepted + bonus)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def write_variant(path, changes):
    cfg_changes = {k: v for k, v in changes.items() if v is not None}
    path = write_released(path, **cfg_changes)
    if any(v is None for v in changes.values()):  # drop keys set to None (absent fields)
        import json
        cfg = json.loads((path / "config.json").read_text())
        for k, v in changes.items():
            if v is None:
                cfg.pop(k, None)
        (path / "config.json").write_text(json.dumps(cfg))
    return path


def reference(path):
    """z-lab's model for checkpoint `path`. z-lab 0.1.0 evaluates `build_target_layer_ids(num_target_layers,
    …)` even when the ids are listed, so a file without `num_target_layers` gets it added here (we do
    not need it)."""
    import json
    cfg = json.loads((path / "config.json").read_text())
    if "num_target_layers" not in cfg:
        ref_path = path.parent / (path.name + "-ref")
        write_released(ref_path)
        (ref_path / "config.json").write_text(json.dumps({**cfg, "num_target_layers": 4}))
        path = ref_path
    return DFlashDraftModel.from_pretrained(str(path), dtype=torch.float32).eval()


def ref_round_logits(ref, target, cache, context, ids, start):
    """z-lab's draft step (`dflash_generate`): new context `context` [1, n, taps·d] ending at `start`,
    block [ids[start], MASK…] -> logits [1, BLOCK−1, V]; then the cache is cropped to `start`."""
    block = torch.full((1, BLOCK), ref.mask_token_id, dtype=torch.long)
    block[0, 0] = ids[0, start]
    scale = float(ref.config.dflash_config.get("input_embedding_scale", 1.0))
    noise = F.embedding(block, target.get_input_embeddings().weight) * scale
    positions = torch.arange(start - context.shape[1], start + BLOCK)[None]
    hidden = ref(target_hidden=context, noise_embedding=noise, position_ids=positions,
                 past_key_values=cache, use_cache=True)[:, 1 - BLOCK:, :]
    _crop_to(cache, start)
    return ref.compute_logits(hidden, target.lm_head)


def assert_same_rounds(ref, ours, target, ids, feats, start=6):
    """Drafts round by round from the same taps; returns the number of rounds compared."""
    cache, memory = _make_cache(ref.config), ours.new_memory(1)
    ours.extend_memory(memory, ids[:, :start], feats[:, :start])
    context, n = feats[:, :start], 0
    with torch.inference_mode():
        for produced in ROUNDS:
            want = ref_round_logits(ref, target, cache, context, ids, start)
            got = ours.draft_logits(memory, ids[:, start], torch.tensor([start]))
            assert (got - want).abs().max().item() <= 1e-5, f"round {n} at position {start}"
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            context = feats[:, start:start + produced]
            ours.extend_memory(memory, ids[:, start:start + produced], context)
            start, n = start + produced, n + 1
    return n


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_drafts_like_the_reference(name, target, tmp_path):
    path = write_variant(tmp_path / name, VARIANTS[name])
    ref, ours = reference(path), DFlashDrafter.from_pretrained(path, target)
    ids = torch.randint(0, MASK, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    feats = extract_context_feature(hs, ref.target_layer_ids)
    assert list(ours.target_layer_ids) == list(ref.target_layer_ids)
    assert assert_same_rounds(ref, ours, target, ids, feats) == len(ROUNDS)


def test_window_variants_really_mask(target, tmp_path):
    """The variants are not vacuous: causal and sliding-window drafts differ from full attention."""
    ids = torch.randint(0, MASK, (1, 30), generator=torch.Generator().manual_seed(4))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=TAPS).taps
    out = {}
    for name in ("full", "causal", "sliding"):
        ours = DFlashDrafter.from_pretrained(write_variant(tmp_path / name, VARIANTS[name]), target)
        memory = ours.new_memory(1)
        ours.extend_memory(memory, ids[:, :25], taps[:, :25])
        out[name] = ours.draft_logits(memory, ids[:, 25], torch.tensor([25]))
    assert (out["full"] - out["causal"]).abs().max() > 1e-3
    assert (out["causal"] - out["sliding"]).abs().max() > 1e-3


def test_target_taps_follow_the_reference_convention(target):
    """Our taps (forward hooks) equal z-lab's `extract_context_feature` of HF hidden states, the last
    layer's (id L−1, after the final norm) included."""
    ids = torch.randint(0, MASK, (1, 12), generator=torch.Generator().manual_seed(5))
    layer_ids = [0, 2, target.config.num_hidden_layers - 1]
    with torch.no_grad():
        want = extract_context_feature(target(input_ids=ids, output_hidden_states=True).hidden_states, layer_ids)
    t = Target(target)
    got = t.forward(ids, t.new_cache(), tap_layer_ids=layer_ids).taps
    assert (got - want).abs().max().item() <= 1e-5
    from flashmap_ext.train.features import compute_taps
    assert (compute_taps(target, ids, layer_ids) - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["causal", "sliding", "sliding-bidirectional"])
def test_training_forward_matches_inference_under_masks(name, target, tmp_path):
    """The training forward applies the same causal / window rule as drafting (inference is checked
    against the reference above)."""
    ours = DFlashDrafter.from_pretrained(write_variant(tmp_path / name, VARIANTS[name]), target)
    ids = torch.randint(0, MASK, (1, 24), generator=torch.Generator().manual_seed(6))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=TAPS).taps
    anchors = torch.tensor([[5, 11, 17]])
    train = ours.forward_train(taps, ids, anchors)
    for a, pos in enumerate(anchors[0].tolist()):
        memory = ours.new_memory(1)
        ours.extend_memory(memory, ids[:, :pos], taps[:, :pos])
        want = ours.draft_logits(memory, ids[:, pos], torch.tensor([pos]))
        assert (train[:, a] - want).abs().max().item() <= 1e-4


REFUSED = {
    "conv": ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "conv_kernel_size": 4}},
             "conv_kernel_size"),
    "rope-dynamic": ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type"),
    "rope-longrope": ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                                        "long_factor": [2.0] * 8}}, "rope_scaling.rope_type"),
    "use-swa": ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "use_swa": True}}, "use_swa"),
    "sink": ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "attention_sink_bias": True}},
             "attention_sink_bias"),
    "interleaved-rope": ({"is_neox_style": False}, "is_neox_style"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act"),
    "no-aux": ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "use_aux_hidden_state": False}},
               "use_aux_hidden_state"),
    # Qwen3Config drops the window without use_sliding_window: z-lab's cache and vLLM both fail on it
    "sliding-no-window": ({"layer_types": SLIDING2, "sliding_window": 4}, "sliding_window"),
    "per-layer-rope": ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}}}, "rope_parameters"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_variants_are_refused_in_one_line(name, target, tmp_path):
    changes, field = REFUSED[name]
    path = write_released(tmp_path / name, **changes)
    with pytest.raises(NotImplementedError) as err:
        DFlashDrafter.from_pretrained(path, target)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_a_dflash2_checkpoint_is_not_loaded_as_dflash(target, tmp_path):
    path = write_released(tmp_path / "d2", architectures=["DFlash2DraftModel"])
    with pytest.raises(ValueError, match="DFlash2") as err:
        DFlashDrafter.from_pretrained(path, target)
    assert "\n" not in str(err.value)


def test_engine_tap_ids_are_offset_by_one():
    """vLLM / speculators store DFlash taps as `eagle_aux_hidden_state_layer_ids` = z-lab ids + 1."""
    cfg = released_config(dflash_config={"mask_token_id": MASK}, eagle_aux_hidden_state_layer_ids=[1, 3, 4])
    assert DFlashConfig.from_hf_dict(cfg).target_layer_ids == (0, 2, 3)
