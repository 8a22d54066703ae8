"""`generate` with a list of prompts of different lengths: each row lossless — at T = 0
in fp32 its plain greedy decoding (full recompute per token), at T > 0 the tokens and stats of its own
solo call with its seed — with per-row budgets, stop tokens and stats. Tiny random Qwen3, CPU."""
import pytest
import torch

import flashmap_ext as fm
from conftest import tiny_qwen3
from support.drafter_doubles import greedy_continuation, random_flashmap

LENGTHS = (7, 13, 4, 10)
BUDGETS = [20, 9, 15, 1]


class RaggedMemory:
    def __init__(self, batch):
        self.rows = [[] for _ in range(batch)]
        self.calls = [0] * batch  # draft calls per row

    @property
    def lengths(self):
        return torch.tensor([len(r) for r in self.rows])

    def truncate(self, lengths):
        self.rows = [r[:int(n)] for r, n in zip(self.rows, lengths)]


class ScheduledOracle:
    """Row b proposes its greedy continuation with slot j corrupted, j = SCHEDULE[(call + anchor) % 5]
    (K = no corruption), so rows accept different counts in the same round; keyed by the row's own
    history (its draft calls, its anchor), not its batch-mates."""
    SCHEDULE = (0, 4, 2, 0, 1)

    def __init__(self, model, K=4):
        self.model, self.num_draft_tokens, self.target_layer_ids = model, K, (0, 2)

    def new_memory(self, batch_size, device):
        return RaggedMemory(batch_size)

    def extend_memory(self, memory, token_ids, taps):
        assert taps.shape[:2] == token_ids.shape
        for row, ids in zip(memory.rows, token_ids.tolist()):
            row.extend(ids)

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        assert position.tolist() == memory.lengths.tolist(), "position must be each anchor's position"
        out = []
        for b, (row, anchor) in enumerate(zip(memory.rows, anchor_tokens.tolist())):
            drafts = greedy_continuation(self.model, row + [anchor], num_tokens)
            memory.calls[b] += 1
            j = self.SCHEDULE[(memory.calls[b] + anchor) % 5]
            if j < num_tokens:
                drafts[j] = (drafts[j] + 1) % 111
            out.append(drafts)
        return torch.stack(out)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(13)
    return [torch.randint(0, 111, (n,), generator=g).tolist() for n in LENGTHS]


def _drafter(model, kind):
    if kind == "ar":
        return None
    if kind == "oracle":
        return ScheduledOracle(model)
    if kind.startswith("flashmap"):
        d = random_flashmap(model, 5, (0, 2)).eval()
        d.config.draft_steps = int(kind[-1])
        return d
    torch.manual_seed(1)
    if kind == "eagle3":
        return fm.Eagle3Drafter.for_target(model, num_draft_tokens=4, dtype=torch.float32).eval()
    return fm.DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=5,
                                       target_layer_ids=[0, 2], dtype=torch.float32).eval()


KINDS = ["ar", "oracle", "flashmap-1", "flashmap-2", "dflash", "eagle3"]


@pytest.mark.parametrize("kind", KINDS)
def test_batch_rows_equal_their_greedy_decoding(model, prompts, kind):
    outs = fm.generate(model, _drafter(model, kind), prompts, BUDGETS, temperature=0.0)
    assert len(outs) == len(prompts)
    for prompt, budget, out in zip(prompts, BUDGETS, outs):
        assert out.tokens == greedy_continuation(model, prompt, budget).tolist()
        assert out.stats.new_tokens == budget and out.stats.prompt_tokens == len(prompt)
    if kind == "oracle":  # rows accepted different counts in the same rounds
        assert len({tuple(o.stats.accepted[:2]) for o in outs[:3]}) > 1


@pytest.mark.parametrize("kind", KINDS)
def test_batch_rows_at_t1_equal_their_solo_calls(model, prompts, kind):
    seeds = [3, 5, 7, 11]
    drafter = _drafter(model, kind)
    outs = fm.generate(model, drafter, prompts, BUDGETS, temperature=1.0, top_p=0.9, seed=seeds)
    for prompt, budget, seed, out in zip(prompts, BUDGETS, seeds, outs):
        solo = fm.generate(model, drafter, prompt, budget, temperature=1.0, top_p=0.9, seed=seed)
        assert out.tokens == solo.tokens
        assert (out.stats.rounds, out.stats.accepted, out.stats.drafted) == \
            (solo.stats.rounds, solo.stats.accepted, solo.stats.drafted)


def test_batch_stop_tokens_end_each_row_as_its_solo_call(model, prompts):
    greedy = [greedy_continuation(model, p, 20).tolist() for p in prompts]
    stop = greedy[0][5]  # row 0 stops at its 6th token; the others wherever this id comes, if at all
    drafter = ScheduledOracle(model)
    outs = fm.generate(model, drafter, prompts, 20, stop_token_ids=[stop])
    assert outs[0].tokens == greedy[0][:greedy[0].index(stop) + 1]
    for prompt, out in zip(prompts, outs):
        solo = fm.generate(model, drafter, prompt, 20, stop_token_ids=[stop])
        assert out.tokens == solo.tokens and out.stats.accepted == solo.stats.accepted


def test_batch_refuses_what_it_cannot_do(model, prompts):
    with pytest.raises(ValueError, match="seed"):
        fm.generate(model, None, prompts, 4, seed=[1, 2])
    with pytest.raises(ValueError, match="max_new_tokens"):
        fm.generate(model, None, prompts, [4, 4])
    with pytest.raises(ValueError, match="tree"):
        fm.generate(model, None, prompts, 4, tree=fm.TreeSpec(2, 2, 4))
    from flashmap_ext.draft_shapes.block_tree import TopKTreeDrafter
    from flashmap_ext.draft_shapes.lookup import LookupDrafter
    from support.drafter_doubles import random_flashmap
    one_row = r"^batch_size: a {} drafts one sequence at a time, got {} \(generate: pass one prompt\)$"
    with pytest.raises(ValueError, match=one_row.format("TopKTreeDrafter", 2)):
        TopKTreeDrafter(random_flashmap(model, 4, [0, 1])).new_memory(2)
    # through generate, the error names what the caller passed (input_ids), not the memory's batch_size
    prompts_row = r"^input_ids: 4 prompts, but a {} drafts one sequence at a time: pass one prompt per generate call$"
    with pytest.raises(ValueError, match=prompts_row.format("LookupDrafter")):  # its memory holds one row
        fm.generate(model, LookupDrafter(None), prompts, 4)
    with pytest.raises(ValueError, match=prompts_row.format("TopKTreeDrafter")):  # as a chain drafter
        fm.generate(model, TopKTreeDrafter(random_flashmap(model, 4, [0, 1])), prompts, 4)
    with pytest.raises(ValueError, match="empty prompt"):
        fm.generate(model, None, [prompts[0], []], 4)


class TapFreeOracle(ScheduledOracle):
    """ScheduledOracle with no tap layers (target_layer_ids = ()): its memory is given taps=None."""

    def __init__(self, model, K=4):
        super().__init__(model, K)
        self.target_layer_ids = ()

    def extend_memory(self, memory, token_ids, taps):
        assert taps is None
        for row, ids in zip(memory.rows, token_ids.tolist()):
            row.extend(ids)


def _hf_greedy(model, prompt, n):
    """n tokens of plain greedy decoding: the HF model's full forward over the whole context per token."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


def test_batch_drafter_without_taps_gets_none_and_rows_equal_their_solo_calls(model, prompts):
    drafter = TapFreeOracle(model)
    outs = fm.generate(model, drafter, prompts, BUDGETS, temperature=0.0)
    for prompt, budget, out in zip(prompts, BUDGETS, outs):
        assert out.tokens == fm.generate(model, drafter, prompt, budget).tokens
        assert out.tokens == _hf_greedy(model, prompt, budget)
    sampled = fm.generate(model, drafter, prompts, BUDGETS, temperature=1.0, seed=[3, 5, 7, 11])
    for prompt, budget, seed, out in zip(prompts, BUDGETS, [3, 5, 7, 11], sampled):
        assert out.tokens == fm.generate(model, drafter, prompt, budget, temperature=1.0, seed=seed).tokens
