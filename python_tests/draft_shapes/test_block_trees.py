"""Trees for block drafters (draft_shapes/block_tree.py) and the prompt-lookup hybrid (draft_shapes/lookup.py)
through `generate(..., tree=TreeSpec(...))` on tiny random Qwen3 targets, plus their tree builders.

References: plain full-recompute greedy decoding at T = 0; at T > 0 the target's exact joint law of the
first 3 tokens (loop_helpers.exact_joint); tree shapes against hand-enumerated expectations.
"""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import Target, TreeSpec, generate
from flashmap_ext.draft_shapes.block_tree import (
    MultiNoiseDrafter,
    SelectorTreeDrafter,
    TopKTreeDrafter,
    merge_chains,
    topk_tree,
)
from flashmap_ext.draft_shapes.lookup import LookupDrafter
from support.drafter_doubles import RecordingDrafter, greedy_continuation
from support.loop_helpers import V_SMALL, assert_matches_joint, prompt_of
from test_speculate import random_flashmap

V, NEW, K = 111, 13, 4
TAPS = (0, 1)
STOP_PROMPT = [79, 0, 94, 5, 29, 11]  # its greedy continuation starts with 10 distinct tokens


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


class SlotOracle(RecordingDrafter):
    """Block double with per-slot log-probs: slot i ranks the target's greedy token at `rank` (or leaves it
    out of the top ranks when rank is None: always wrong) among wrong tokens (truth + 1 + j) % V. Noise draw
    `truth_draw` (None: every draw) puts the truth first; other draws put a wrong token first.
    `wrong_depth`: the truth at that depth is replaced by a wrong token in every rank."""

    def __init__(self, model, k=K, rank=0, truth_draw=None, wrong_depth=None):
        super().__init__(k, TAPS)
        self.model, self.V = model, model.config.vocab_size
        self.rank, self.truth_draw, self.wrong_depth = rank, truth_draw, wrong_depth
        self.calls_per_round: list = []

    def draft_log_probs(self, memory, anchor, position, seed, noise_draw):
        assert int(position[0]) == len(memory.token_ids)
        truth = greedy_continuation(self.model, memory.token_ids + [int(anchor[0])], self.num_draft_tokens).tolist()
        logp = torch.full((self.num_draft_tokens, self.V), -30.0)
        for i, tok in enumerate(truth):
            good = self.rank is not None and (self.truth_draw is None or self.truth_draw == noise_draw)
            if self.wrong_depth == i + 1:
                good = False
            ranked = [(tok + 1 + j + noise_draw) % self.V for j in range(4)]
            if good:
                ranked.insert(self.rank if self.truth_draw is None else 0, tok)
            for r, t in enumerate(ranked[:4]):
                logp[i, t] = -float(r) - 0.1 * i
        return torch.log_softmax(logp, dim=-1)

    def propose(self, memory, anchor, k, seed, position):
        pos = torch.tensor([position])
        return self.draft_log_probs(memory, torch.tensor([anchor]), pos, seed, 0)[:k].argmax(-1)[None]


class WrongLookup(LookupDrafter):
    """Prompt lookup whose every proposed token is wrong: the real continuation shifted by one id."""

    def lookup(self, memory, anchor_tokens, num_tokens):
        ctx = memory.token_ids + [int(anchor_tokens[0])]
        truth = greedy_continuation(self.model, ctx, num_tokens).tolist()
        return [(t + 1) % V for t in truth]


def greedy(model, prompt, n):
    return greedy_continuation(model, prompt, n).tolist()


# --- tree builders -------------------------------------------------------------------------------------
def test_merge_chains_prefix_tree_budget_and_order():
    tree = merge_chains([[5, 6, 7], [5, 8], [9]], [[-1, -2, -3], [-0.5, -0.6], [-4]], num_nodes=4, depth=3)
    # nodes: 5 (score max(-1,-0.5)), 6 (-2), 7 (-3), 8 (-0.6), 9 (-4) → best 4: 5, 8, 6, 7 in topological order
    assert tree.tokens.tolist() == [5, 6, 7, 8] and tree.parents.tolist() == [-1, 0, 1, 0]
    assert tree.depths.tolist() == [1, 2, 3, 2]
    cut = merge_chains([[1, 2, -1, 4], [3]], num_nodes=10, depth=2)
    assert cut.tokens.tolist() == [1, 2, 3] and cut.parents.tolist() == [-1, 0, -1]
    assert merge_chains([[], []], num_nodes=5, depth=5).tokens.numel() == 0


def test_topk_tree_is_best_first_by_cumulative_log_prob():
    logp = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]))
    tree = topk_tree(logp, topk=2, num_nodes=5, depth=3)
    # reference: all depth ≤ 3 paths over the top-2 tokens per slot, scored by the product of probabilities
    paths = {(0,): .6, (1,): .3, (0, 0): .3, (0, 1): .24, (1, 0): .15, (1, 1): .12, (0, 0, 0): .27,
             (0, 0, 1): .015, (0, 1, 0): .216}
    best = sorted(paths, key=lambda p: -paths[p])[:5]
    got = []
    for i in range(5):
        path, j = [], i
        while j >= 0:
            path.insert(0, int(tree.tokens[j]))
            j = int(tree.parents[j])
        got.append(tuple(path))
    assert sorted(got) == sorted(best)
    assert torch.allclose(tree.scores.exp(), torch.tensor([paths[p] for p in got]).float())
    assert topk_tree(logp, topk=3, num_nodes=100, depth=2).tokens.numel() == 3 + 9


def random_dflash2(model, k=K, top_k=5):
    """A random DFlash2 drafter, its convolutions and selector random too (so the selector reorders)."""
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    torch.manual_seed(1)
    d = DFlash2Drafter.for_target(model, mask_token_id=model.config.vocab_size - 1, block_size=k + 1,
                                  num_hidden_layers=1, target_layer_ids=list(TAPS), selector_rank=4,
                                  selector_top_k=top_k).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "conv" in name or "selector" in name:
                p.copy_(torch.randn_like(p) * (0.3 if "conv" in name else 1.0))
    return d


def test_selector_tree_scores_are_cumulative_edge_log_probs(model):
    """Depth-1 nodes are the anchor's best candidates by edge log-probability; every node's score is its
    parent's plus its own edge log-probability given the parent's token (recomputed here slot by slot)."""
    d = random_dflash2(model)
    ids = torch.tensor([prompt_of(9)])
    t = Target(model)
    memory = d.new_memory(1)
    d.extend_memory(memory, ids[:, :8], t.forward(ids[:, :8], t.new_cache(), tap_layer_ids=TAPS).taps)
    anchor, pos = ids[0, 8:9], torch.tensor([8])
    tree = SelectorTreeDrafter(d).draft_tree(memory, anchor, pos, depth=K, topk=3, num_nodes=12)
    hidden = d.block_hidden(memory, anchor, pos)[0]
    unary = d.vocab_logits(hidden)
    for i in range(tree.tokens.numel()):
        parent = int(tree.parents[i])
        prev = int(anchor) if parent < 0 else int(tree.tokens[parent])
        slot = int(tree.depths[i]) - 1
        cands, logp = d.candidate_selector.edge_log_probs(unary[slot], hidden[slot], prev)
        edge = float(logp[cands.tolist().index(int(tree.tokens[i]))])
        base = 0.0 if parent < 0 else float(tree.scores[parent])
        assert float(tree.scores[i]) == pytest.approx(base + edge, abs=1e-5)
    assert tree.tokens.numel() == 12
    full = SelectorTreeDrafter(d).draft_tree(memory, anchor, pos, depth=K, topk=3, num_nodes=500)
    assert full.tokens.numel() == 3 + 9 + 27 + 81  # every node expanded: topk children per node
    cands, logp = d.candidate_selector.edge_log_probs(unary[0], hidden[0], int(anchor))
    assert [int(t) for t, p in zip(full.tokens, full.parents) if p < 0] == cands[logp.topk(3).indices].tolist()
    kept = sorted(full.scores.tolist(), reverse=True)[:12]  # best-first: the 12-node tree = the 12 best nodes
    assert sorted(tree.scores.tolist(), reverse=True) == pytest.approx(kept, abs=1e-6)


# --- T = 0: token identity with plain greedy ------------------------------------------------------------
def tree_drafter(model, kind):
    if kind == "multinoise-random":
        return MultiNoiseDrafter(random_flashmap(model, K, TAPS))
    if kind == "topk-random":
        return TopKTreeDrafter(random_flashmap(model, K, TAPS))
    if kind == "topk-dflash":
        from flashmap_ext.drafters.dflash import DFlashDrafter
        torch.manual_seed(1)
        return TopKTreeDrafter(DFlashDrafter.for_target(model, mask_token_id=V - 1, block_size=K + 1,
                                                        num_hidden_layers=1, target_layer_ids=list(TAPS)))
    if kind == "selector-dflash2":
        return SelectorTreeDrafter(random_dflash2(model))
    if kind == "hybrid-random":
        return LookupDrafter(random_flashmap(model, K, TAPS), num_lookup_tokens=5)
    kinds = {"multinoise-oracle": (MultiNoiseDrafter, dict(truth_draw=1)),
             "multinoise-wrong": (MultiNoiseDrafter, dict(rank=None)),
             "topk-oracle-rank1": (TopKTreeDrafter, dict(rank=1)),
             "topk-wrong": (TopKTreeDrafter, dict(rank=None))}
    cls, kw = kinds[kind]
    return cls(SlotOracle(model, **kw))


KINDS = ["multinoise-random", "multinoise-oracle", "multinoise-wrong", "topk-random", "topk-dflash",
         "topk-oracle-rank1", "topk-wrong", "hybrid-random", "selector-dflash2"]


@pytest.mark.parametrize("prompt_len", [1, 17])
@pytest.mark.parametrize("kind", KINDS)
def test_trees_greedy_identical_to_plain_greedy(model, kind, prompt_len):
    prompt = prompt_of(prompt_len)
    spec = TreeSpec(depth=K, topk=2, num_nodes=30)  # a full depth-4 binary tree: 30 nodes
    out = generate(model, tree_drafter(model, kind), prompt, NEW, tree=spec)
    assert out.tokens == greedy(model, prompt, NEW)
    s = out.stats
    assert all(d <= spec.num_nodes for d in s.drafted) and 1 + sum(a + 1 for a in s.accepted) == NEW
    if kind in ("multinoise-oracle", "topk-oracle-rank1"):  # the truth sits only in the second branch
        assert s.accepted[:-1] == [K] * (s.rounds - 1)
    if kind.endswith("wrong"):
        assert sum(s.accepted) == 0


def test_multinoise_draws_use_distinct_noise(model):
    drafter = MultiNoiseDrafter(random_flashmap(model, K, TAPS))
    ids = torch.tensor([prompt_of(17)])
    target = Target(model)
    out = target.forward(ids, target.new_cache(), tap_layer_ids=TAPS)
    memory = drafter.new_memory(1, "cpu")
    drafter.extend_memory(memory, ids[:, :-1], out.taps[:, :-1])
    kw = dict(depth=K, num_nodes=100, seed=torch.tensor([3]))
    one = drafter.draft_tree(memory, ids[:, -1], torch.tensor([16]), topk=1, **kw)
    four = drafter.draft_tree(memory, ids[:, -1], torch.tensor([16]), topk=4, **kw)
    assert one.tokens.numel() == K and four.tokens.numel() > K  # draws differ → more than one chain
    chain = drafter.draft(memory, ids[:, -1], num_tokens=K, seed=torch.tensor([3]), position=torch.tensor([16]))
    assert one.tokens.tolist() == chain[0].tolist()  # draw 0 is the chain's own noise


@pytest.mark.parametrize("draft_vocab", [None, 20])
def test_block_top_k_is_the_top_of_the_full_log_probs(model, draft_vocab):
    from flashmap_ext.draft_shapes.block_tree import block_log_probs, block_top_k
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    torch.manual_seed(1)
    fm = FlashMapDrafter.for_target(model, n_layers=2, width=64, heads=4, block_size=K, target_layer_ids=TAPS,
                                    draft_vocab_size=draft_vocab)
    fm.reset_parameters(zero_init=False)
    if draft_vocab:
        fm.set_draft_vocab(torch.arange(5, 105, 5), model)
    ids = torch.tensor([prompt_of(17)])
    target = Target(model)
    taps = target.forward(ids, target.new_cache(), tap_layer_ids=TAPS).taps
    memory = fm.new_memory(1, "cpu")
    fm.extend_memory(memory, ids[:, :-1], taps[:, :-1])
    args = (memory, ids[:, -1], torch.tensor([16]), torch.tensor([3]))
    ref = block_log_probs(fm, *args).topk(3, dim=-1)
    values, tokens = block_top_k(fm, *args, 3)
    assert torch.allclose(values, ref.values) and torch.equal(tokens, ref.indices)
    assert not draft_vocab or torch.isin(tokens, torch.arange(5, 105, 5)).all()


@pytest.mark.parametrize("kind", ["multinoise-oracle", "topk-oracle-rank1", "hybrid-wrong"])
@pytest.mark.parametrize("index", range(6))
def test_stop_token_inside_the_accepted_branch(model, kind, index):
    ref = greedy(model, STOP_PROMPT, 10)
    assert len(set(ref)) == len(ref)
    drafter = hybrid_wrong(model, SlotOracle(model)) if kind == "hybrid-wrong" else tree_drafter(model, kind)
    seen = []
    out = generate(model, drafter, STOP_PROMPT, 10, tree=TreeSpec(K, 2, 8), stop_token_ids=[ref[index]],
                   on_tokens=seen.append)
    assert out.tokens == ref[:index + 1] and sum(seen, []) == out.tokens


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 6, 9])
@pytest.mark.parametrize("kind", ["multinoise-oracle", "topk-oracle-rank1", "hybrid-wrong"])
def test_max_new_tokens_is_exact(model, kind, budget):
    drafter = hybrid_wrong(model, SlotOracle(model)) if kind == "hybrid-wrong" else tree_drafter(model, kind)
    out = generate(model, drafter, STOP_PROMPT, budget, tree=TreeSpec(K, 2, 8))
    assert out.tokens == greedy(model, STOP_PROMPT, 9)[:budget]
    assert all(d <= max(budget - 2, 0) for d in out.stats.depths)


# --- the hybrid ---------------------------------------------------------------------------------------
def hybrid_wrong(model, inner=None):
    drafter = WrongLookup(inner, num_lookup_tokens=K)
    drafter.model = model
    return drafter


@pytest.mark.parametrize("inner", [None, "oracle", "random"])
@pytest.mark.parametrize("tree", [None, TreeSpec(K, 2, 2 * K)])
def test_hybrid_with_wrong_ngrams_is_greedy(model, inner, tree):
    inner_drafter = {None: None, "oracle": SlotOracle(model), "random": random_flashmap(model, K, TAPS)}[inner]
    drafter = hybrid_wrong(model, inner_drafter)
    prompt = prompt_of(17)
    out = generate(model, drafter, prompt, NEW, tree=tree)
    assert out.tokens == greedy(model, prompt, NEW)
    if inner is None or (inner == "oracle" and tree is None):  # wrong lookup wins the chain: nothing accepted
        assert sum(out.stats.accepted) == 0
    if inner == "oracle" and tree is not None:  # the oracle's branch is accepted in full
        assert out.stats.accepted[:-1] == [K] * (out.stats.rounds - 1)


def test_hybrid_memory_is_the_inner_drafters_alone(model):
    prompt = prompt_of(17)
    alone, inner = SlotOracle(model), SlotOracle(model)
    generate(model, alone, prompt, NEW)
    hybrid = LookupDrafter(inner, num_lookup_tokens=3)
    out = generate(model, hybrid, prompt, NEW)
    assert out.tokens == greedy(model, prompt, NEW)
    assert inner.last_memory.token_ids == alone.last_memory.token_ids == (prompt + out.tokens)[:-1]
    assert torch.allclose(torch.cat(inner.last_memory.taps, 1), torch.cat(alone.last_memory.taps, 1), atol=1e-5)


def test_lookup_matches_transformers_rule():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from flashmap_ext.draft_shapes.lookup import lookup_continuation
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        n, vocab = int(torch.randint(2, 40, (1,), generator=gen)), int(torch.randint(2, 6, (1,), generator=gen))
        ids = torch.randint(0, vocab, (1, n), generator=gen)
        num, ngram = trial % 5 + 1, trial % 3 + 1
        ref = PromptLookupCandidateGenerator(num_output_tokens=num, max_matching_ngram_size=ngram, max_length=10_000)
        cand, _ = ref.get_candidates(ids)
        assert lookup_continuation(ids[0].tolist(), num, ngram) == cand[0, n:].tolist(), (ids, num, ngram)


def test_lookup_drafter_proposes_the_repeat_and_refuses_bad_sizes(model):
    prompt = [7, 8, 9, 10, 11, 7, 8]
    drafter = LookupDrafter(None, num_lookup_tokens=3)
    memory = drafter.new_memory(1, "cpu")
    drafter.extend_memory(memory, torch.tensor([prompt[:-1]]), None)
    got = drafter.draft(memory, torch.tensor([8]), num_tokens=5, seed=torch.tensor([0]), position=torch.tensor([6]))
    assert got.tolist() == [[9, 10, 11]]
    for bad, name in ((dict(num_lookup_tokens=0), "num_lookup_tokens"), (dict(max_ngram=0), "max_ngram"),
                      (dict(min_ngram=3, max_ngram=2), "min_ngram <= max_ngram")):
        with pytest.raises(ValueError, match=name):
            LookupDrafter(None, **bad)


# --- T > 0: the first 3 tokens follow the target's joint law ----------------------------------------------
@pytest.mark.parametrize("kind", ["hybrid-chain", "hybrid-tree", "multinoise", "topk"])
def test_sampling_matches_target_joint_distribution(kind):
    small = tiny_qwen3(vocab_size=V_SMALL, num_layers=3, seed=3)
    filters = dict(temperature=0.9, top_k=6, top_p=0.95)
    prompt = [1, 2, 1, 2, 3]
    fm = random_flashmap(small, 3, TAPS)
    drafter = {"hybrid-chain": LookupDrafter(fm, num_lookup_tokens=3), "hybrid-tree": LookupDrafter(fm, num_lookup_tokens=3),
               "multinoise": MultiNoiseDrafter(fm), "topk": TopKTreeDrafter(fm)}[kind]
    spec = None if kind == "hybrid-chain" else TreeSpec(depth=3, topk=3 if kind == "topk" else 2, num_nodes=5)
    target = Target(small)

    def run(seed):
        out = generate(target, drafter, prompt, 4, seed=seed, tree=spec, **filters)
        return out.tokens, sum(out.stats.accepted)
    assert_matches_joint(small, prompt, run, 800, filters)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selector_tree_sampling_matches_target_joint_distribution(temperature):
    """DFlash2 selector trees at T > 0 (T = 1 unfiltered): the first 3 tokens follow the target's exact law."""
    small = tiny_qwen3(vocab_size=V_SMALL, num_layers=3, seed=3)
    drafter = SelectorTreeDrafter(random_dflash2(small, k=3, top_k=4))
    target, prompt, filters = Target(small), [1, 2, 1, 2, 3], dict(temperature=temperature, top_k=0, top_p=1.0)

    def run(seed):
        out = generate(target, drafter, prompt, 4, seed=seed, tree=TreeSpec(depth=3, topk=2, num_nodes=6), **filters)
        return out.tokens, sum(out.stats.accepted)
    assert_matches_joint(small, prompt, run, 800, filters)


# --- command line ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [["--lookup"], ["--drafter", "random", "--lookup", "--tree", "4,2,8"],
                                   ["--drafter", "random", "--block-tree", "topk", "--tree", "4,3,8"],
                                   ["--drafter", "random", "--block-tree", "multinoise", "--tree", "4,2,8"],
                                   ["--drafter", "random", "--auto"]])
def test_generate_cli_shapes_print_the_greedy_text(extra, capsys, tmp_path, monkeypatch):
    from support.cli_runs import BASE, run_cli
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))  # --auto calibrates into a fresh cache
    ar_out, _ = run_cli(BASE, capsys)
    out, err = run_cli(BASE + extra, capsys)
    assert out == ar_out and "24 tokens" in err
    if "--auto" in extra:
        assert "auto:" in err and list((tmp_path / "costs").glob("*.json"))
    from flashmap_ext import cli
    assert cli.main(BASE + ["--block-tree", "topk"]) == 2
    assert "--block-tree needs" in capsys.readouterr().err
