"""`flashmap_ext.draft_block`, one drafting call for FlashMap, DFlash and EAGLE-3 chains, and
`FlashMapDrafter.for_target`'s presets and init. Tiny random targets, CPU."""
import pytest
import torch

import flashmap_ext as fm
from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap.config import SHAPES

S = 9  # prompt tokens: the anchor is the last one, at position S - 1


def _drafters(model):
    torch.manual_seed(1)
    flash = fm.FlashMapDrafter.for_target(model, "cpu-tiny", init="random", target_layer_ids=(0, 2))
    dflash = fm.DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=6,
                                         target_layer_ids=[0, 2], dtype=torch.float32)
    dflash2 = fm.DFlash2Drafter.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=6,
                                           target_layer_ids=[0, 2], dtype=torch.float32)
    eagle = fm.Eagle3Drafter.for_target(model, num_draft_tokens=4, dtype=torch.float32)
    return {"flashmap": flash.eval(), "dflash": dflash.eval(), "dflash2": dflash2.eval(), "eagle3": eagle.eval()}


def _memory(model, drafter, ids, device="cpu"):
    """The drafter's memory of ids[:, :-1], its taps read from HF's own hidden states (tap i = hidden_states[i + 1]);
    made by new_memory(B, device), or new_memory(B) for device None."""
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    taps = torch.cat([hidden[i + 1] for i in drafter.target_layer_ids], dim=-1)
    B = ids.shape[0]
    memory = drafter.new_memory(B) if device is None else drafter.new_memory(B, device)
    drafter.extend_memory(memory, ids[:, :-1], taps[:, :-1])
    return memory


@pytest.fixture(scope="module")
def setup():
    model = tiny_qwen3()
    ids = torch.randint(0, 100, (2, S), generator=torch.Generator().manual_seed(3))
    return model, ids, _drafters(model)


@pytest.mark.parametrize("kind, K", [("flashmap", 8), ("dflash", 5), ("eagle3", 4)])
def test_draft_block_one_call_for_every_drafter(setup, kind, K):
    model, ids, drafters = setup
    drafter = drafters[kind]
    assert drafter.num_draft_tokens == K  # FlashMap: block_size; DFlash: block_size - 1; EAGLE-3: its chain
    memory = _memory(model, drafter, ids)
    seed, position = torch.tensor([5, 6]), torch.full((2,), S - 1)
    block = fm.draft_block(drafter, memory, ids[:, -1], seed=seed, position=position, return_logits=True)
    assert isinstance(block, fm.DraftBlock)
    assert block.tokens.shape == (2, K) and block.tokens.dtype == torch.int64
    assert block.logits.shape[:2] == (2, K) and block.logits.dtype == torch.float32
    assert torch.equal(block.tokens, block.logits.argmax(-1))  # full draft vocabulary: row i is target id i
    short = fm.draft_block(drafter, memory, ids[:, -1], num_tokens=2, seed=seed, position=S - 1)
    assert torch.equal(short.tokens, block.tokens[:, :2]) and short.logits is None


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "eagle3"])
@pytest.mark.parametrize("position", [S - 1, None])
def test_draft_block_names_an_anchor_batch_the_memory_does_not_have(setup, kind, position):
    """2 anchors on a batch-1 memory blamed `position` ([8, 8] vs lengths [8])."""
    model, ids, drafters = setup
    if position is None and kind != "flashmap":
        pytest.skip("position is required for DFlash and EAGLE-3")
    memory = _memory(model, drafters[kind], ids[:1])  # batch 1
    noise = None if position is not None else torch.zeros(2, 8, model.config.hidden_size)
    with pytest.raises(ValueError, match=r"anchor_tokens: batch 2, but the memory has batch 1") as err:
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=position, noise=noise)
    assert "position" not in str(err.value)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "eagle3"])
def test_draft_block_refuses_a_position_the_memory_disagrees_with(setup, kind):
    model, ids, drafters = setup
    memory = _memory(model, drafters[kind], ids)
    with pytest.raises(ValueError, match="position"):
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=S)  # an extend_memory too few
    with pytest.raises(ValueError, match="num_tokens"):
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=S - 1, num_tokens=9)
    # per row, after a ragged truncate: one row's position one behind its memory (an extra extend_memory)
    memory.truncate(torch.tensor([S - 1, S - 3]))
    with pytest.raises(ValueError, match=r"position: \[8, 5\] disagrees with the memory's committed lengths \[8, 6\]"):
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=torch.tensor([S - 1, S - 4]))
    fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=torch.tensor([S - 1, S - 3]))  # agrees


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "dflash2", "eagle3"])
@pytest.mark.parametrize("anchor", [111, -1])
def test_draft_block_refuses_an_anchor_outside_the_vocabulary_naming_it(setup, kind, anchor):
    """DFlash's and EAGLE-3's embedding lookup raised a bare "IndexError: index out of range in self"."""
    model, ids, drafters = setup
    memory = _memory(model, drafters[kind], ids)
    with pytest.raises(ValueError, match=r"anchor_tokens: expected ids in \[0, 111\) \(the target's vocabulary\)"):
        fm.draft_block(drafters[kind], memory, torch.tensor([5, anchor]), seed=0, position=S - 1)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "dflash2", "eagle3"])
@pytest.mark.parametrize("ids, error, message", [
    (lambda ids: ids.float(), TypeError, r"token_ids: expected integer token ids \(int64\), got torch.float32"),
    (lambda ids: ids.clone().fill_(111), ValueError, r"token_ids: expected ids in \[0, 111\)"),
    (lambda ids: ids.clone().fill_(-1), ValueError, r"token_ids: expected ids in \[0, 111\)"),
    (lambda ids: ids.tolist(), ValueError, r"token_ids: expected \[B, T\] int64 token ids, got list"),
])
def test_extend_memory_refuses_ids_that_are_no_token_of_the_vocabulary(setup, kind, ids, error, message):
    model, good, drafters = setup
    drafter = drafters[kind]
    with torch.no_grad():
        hidden = model(input_ids=good, output_hidden_states=True).hidden_states
    taps = torch.cat([hidden[i + 1] for i in drafter.target_layer_ids], dim=-1)
    with pytest.raises(error, match=message):
        drafter.extend_memory(drafter.new_memory(2, "cpu"), ids(good), taps)


@pytest.mark.parametrize("kind, other", [("dflash", "flashmap"), ("dflash2", "flashmap"), ("eagle3", "flashmap"),
                                         ("flashmap", "dflash"), ("dflash", "eagle3")])
def test_draft_block_refuses_another_drafters_memory_naming_both_types(setup, kind, other):
    """A FlashMapMemory given to a DFlash drafter raised "AttributeError: 'FlashMapMemory' object has no
    attribute 'batch'"; the reverse direction already named `memory`."""
    model, ids, drafters = setup
    memory = _memory(model, drafters[other], ids)
    want, got = type(drafters[kind].new_memory(1, "cpu")).__name__, type(memory).__name__
    with pytest.raises(TypeError, match=rf"^memory: expected the {want} of drafter.new_memory\(B\) .*got {got}$"):
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=S - 1)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "dflash2", "eagle3"])
def test_a_memory_from_another_drafter_of_the_same_type_is_refused(setup, kind):
    """A memory filled by another drafter of the same class and shape (other weights) was drafted from silently:
    its K/V are the other drafter's. Both draft_block and extend_memory now refuse it; the maker still drafts."""
    model, ids, drafters = setup
    torch.manual_seed(7)
    twin = _drafters(model)[kind]
    memory = _memory(model, twin, ids)
    name = type(twin).__name__
    with pytest.raises(ValueError, match=rf"^memory: made by another {name} \(its new_memory\), not by this {name}:"):
        fm.draft_block(drafters[kind], memory, ids[:, -1], seed=0, position=S - 1)
    with torch.no_grad():
        taps = torch.cat([model(input_ids=ids, output_hidden_states=True).hidden_states[i + 1]
                          for i in twin.target_layer_ids], dim=-1)
    with pytest.raises(ValueError, match=r"^memory: made by another"):
        drafters[kind].extend_memory(memory, ids[:, -1:], taps[:, -1:])
    assert fm.draft_block(twin, memory, ids[:, -1], seed=0, position=S - 1).tokens.shape[0] == 2


def test_a_dflash_memory_given_to_a_dflash2_drafter_names_its_maker(setup):
    """DFlash2's memory is DFlash's type, so only its maker tells them apart: the message names that class."""
    model, ids, drafters = setup
    memory = _memory(model, drafters["dflash"], ids)
    with pytest.raises(ValueError, match=r"^memory: made by a DFlashDrafter \(its new_memory\), not by this "
                                         r"DFlash2Drafter:"):
        fm.draft_block(drafters["dflash2"], memory, ids[:, -1], seed=0, position=S - 1)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "eagle3"])
@pytest.mark.parametrize("wrapper", ["TopKTreeDrafter", "MultiNoiseDrafter"])
def test_a_wrapper_drafts_from_its_own_and_its_inner_drafters_memory(setup, kind, wrapper):
    """A tree wrapper's new_memory is its inner drafter's: draft_block took it for the inner drafter but refused it
    for the wrapper itself ("made by another TopKTreeDrafter"). Both hold the same entries, so both are taken."""
    from flashmap_ext.draft_shapes import block_tree
    model, ids, drafters = setup
    inner = drafters[kind]
    wrapped = getattr(block_tree, wrapper)(inner)
    own = _memory(model, wrapped, ids[:1], None)  # new_memory(1) without a device: the inner drafter's default
    inner_memory = _memory(model, inner, ids[:1])
    for drafter, memory in ((wrapped, own), (wrapped, inner_memory), (inner, own)):
        block = fm.draft_block(drafter, memory, ids[:1, -1], seed=0, position=S - 1)
        assert block.tokens.shape == (1, inner.num_draft_tokens)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_a_memory_filled_before_the_drafter_changed_dtype_is_refused(setup, kind):
    """DFlash / EAGLE-3 memories hold K/V in the drafter's dtype: after `.to(torch.bfloat16)` an fp32 memory
    raised torch's "Expected query, key, and value to have the same dtype"; now one line naming `memory`."""
    import copy
    model, ids, drafters = setup
    drafter = copy.deepcopy(drafters[kind])
    memory = _memory(model, drafter, ids)
    drafter.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^memory: filled in torch.float32 while the \w+ now runs in "
                                         r"torch.bfloat16"):
        fm.draft_block(drafter, memory, ids[:, -1], seed=0, position=S - 1)
    drafter.float()
    assert fm.draft_block(drafter, memory, ids[:, -1], seed=0, position=S - 1).tokens.shape[0] == 2


@pytest.mark.parametrize("other", ["flashmap", "dflash"])
def test_a_lookup_drafter_refuses_another_drafters_memory_and_float_ids(setup, other):
    """LookupDrafter raised "AttributeError: ... has no attribute 'token_ids'" for a FlashMap or DFlash memory, and
    its extend_memory took float ids."""
    from flashmap_ext.draft_shapes.lookup import LookupDrafter
    model, ids, drafters = setup
    lookup = LookupDrafter(drafters["flashmap"])
    memory = _memory(model, drafters[other], ids[:1])
    with pytest.raises(TypeError, match=rf"^memory: expected the LookupMemory .*got {type(memory).__name__}$"):
        fm.draft_block(lookup, memory, ids[:1, -1], seed=0, position=S - 1)
    with pytest.raises(TypeError, match=r"^token_ids: expected .* integer token ids, got torch.float32$"):
        lookup.extend_memory(lookup.new_memory(1, "cpu"), ids[:1].float(), None)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "eagle3"])
@pytest.mark.parametrize("bad, error", [(-1, ValueError), (0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_new_memory_refuses_a_bad_batch_size_naming_it(setup, kind, bad, error):
    """new_memory(batch_size=-1) was torch's "zeros: Dimension size must be non-negative"."""
    drafter = setup[2][kind]
    with pytest.raises(error, match=rf"{type(drafter).__name__}.new_memory: batch_size must be"):
        drafter.new_memory(batch_size=bad)


def test_draft_block_steps_and_noise_are_flashmap_only(setup):
    model, ids, drafters = setup
    memory = _memory(model, drafters["dflash"], ids)
    for kwargs in (dict(steps=2), dict(noise=torch.zeros(2, 5, 64))):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fm.draft_block(drafters["dflash"], memory, ids[:, -1], position=S - 1, **kwargs)
    with pytest.raises(ValueError, match="position"):
        fm.draft_block(drafters["dflash"], memory, ids[:, -1])


def test_for_target_takes_a_preset_or_explicit_sizes_and_never_guesses():
    model = tiny_qwen3()
    with pytest.raises(ValueError, match="preset"):
        fm.FlashMapDrafter.for_target(model)
    with pytest.raises(ValueError, match="preset.*heads"):
        fm.FlashMapDrafter.for_target(model, n_layers=1, width=32)
    with pytest.raises(ValueError, match="preset"):
        fm.FlashMapDrafter.for_target(model, "qwen3-0.6b")
    with pytest.raises(ValueError, match="init"):
        fm.FlashMapDrafter.for_target(model, "cpu-tiny", init="xavier")
    c = fm.FlashMapDrafter.for_target(model, "cpu-tiny", block_size=4).config
    assert (c.n_layers, c.width, c.heads, c.block_size) == (SHAPES["cpu-tiny"]["n_layers"],
                                                            SHAPES["cpu-tiny"]["width"], SHAPES["cpu-tiny"]["heads"], 4)
    assert (c.d_target, c.vocab_size) == (64, 111)


@pytest.mark.parametrize("build", [
    lambda model: fm.FlashMapDrafter.for_target(model, "cpu-tiny", target_layer_ids=[7]),
    lambda model: fm.DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=1, target_layer_ids=[7]),
])
def test_for_target_refuses_tap_layers_the_target_lacks(build):
    model = tiny_qwen3()
    assert model.config.num_hidden_layers == 4
    with pytest.raises(ValueError, match=r"target_layer_ids \[7\] outside .*\b4\)? .*layers"):
        build(model)


def test_for_target_init_zero_drafts_one_id_random_drafts_many():
    model = tiny_qwen3()
    ids = torch.randint(0, 100, (1, S), generator=torch.Generator().manual_seed(4))
    drafts = {}
    for init in ("zero", "random"):
        torch.manual_seed(2)
        drafter = fm.FlashMapDrafter.for_target(model, "cpu-tiny", init=init, target_layer_ids=(0, 2)).eval()
        memory = _memory(model, drafter, ids)
        drafts[init] = fm.draft_block(drafter, memory, ids[:, -1], seed=1, position=S - 1).tokens
    assert drafts["zero"].unique().numel() == 1    # adaLN-Zero: every logit 0, argmax = id 0 in every slot
    assert drafts["random"].unique().numel() > 1
