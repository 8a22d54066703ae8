"""Draft trees in the testbed (synthetic/trees.py): the exact acceptance of a tree against the language, checked
against a float64 hand computation on a 3-node tree, against the library's own tree verification
(`tree.tree_accept`, what `speculate.generate`'s tree round runs) sampled many times at T = 1 and run at T = 0,
and against the chain scoring on single-path trees; the drafting pass and the rows' names and refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashmap_ext.draft_shapes.block_tree import MultiNoiseDrafter, topk_tree
from flashmap_ext.drafters.common.base import TreeSpec
from flashmap_ext.drafters.eagle3.tree import DraftTree
from flashmap_ext.evaluate.heldout import anchors, iter_trees
from flashmap_ext.synthetic.ceilings import greedy_chain, marginals
from flashmap_ext.synthetic.language import BOS, Language, LanguageSpec, Parser
from flashmap_ext.synthetic.report import markdown
from flashmap_ext.synthetic.testbed import heldout_sequences, score_drafts
from flashmap_ext.synthetic.trees import score_trees, tree_accepted, tree_drafters, tree_tallies
from flashmap_ext.tree import tree_accept

K = 4


@pytest.fixture(scope="module")
def world():
    lang = Language(LanguageSpec(body=24))
    return lang, heldout_sequences(lang, 6, seed=9)


def test_a_three_node_tree_by_hand():
    """Free state after header token x: succ_a(x) has p = (1 − 0.2 − 0.1) · 0.85 = 0.595 (the argmax), the first
    phrase marker 0.2 / 8 = 0.025. Tree: a1 = succ_a(x) and P_0 under the anchor, a2 = succ_a(a1) under a1."""
    lang = Language(LanguageSpec())
    header = list(lang.header_ids)[:lang.spec.header]
    parser = Parser(lang, [BOS] + header)
    a1 = lang.succ[header[-1]][0]
    a2 = lang.succ[a1][0]
    tokens, parents = [a1, lang.phrase_markers[0], a2], [-1, -1, 0]
    acc0, acc1, slots0, slots1 = tree_accepted(parser, parser.states[-1], tokens, parents, 3)
    assert acc1 == pytest.approx(0.595 + 0.025 + 0.595 * 0.595, rel=1e-12)  # 0.974025
    assert slots1 == pytest.approx([0.62, 0.354025, 0.0], rel=1e-12)
    assert (acc0, list(slots0)) == (2.0, [1.0, 1.0, 0.0])


def language_tree(parser, state, nodes: int, seed: int):
    """A top-k tree (the bench's builder) over the exact marginals, perturbed so that it is not the greedy
    chain's, plus a repeated sibling (with a child) of the first root child: it must never be accepted."""
    logp = torch.log(torch.tensor([[m.get(t, 0.0) for t in range(parser.lang.vocab_size)]
                                   for m in marginals(parser, state, K)], dtype=torch.float64) + 1e-9)
    logp += torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tree = topk_tree(logp, topk=3, num_nodes=nodes, depth=K)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    root_children = [i for i, p in enumerate(parents) if p == -1]
    tokens += [tokens[root_children[0]], tokens[root_children[0]]]
    parents += [-1, len(parents)]
    return tokens, parents


def language_logits(parser, state, tokens, parents) -> torch.Tensor:
    """[N + 1, V] target logits: row 0 the anchor's exact next-token law, row 1 + i node i's (−inf outside the
    support; a node on an impossible path gets a uniform row, never read since it is never reached)."""
    v = parser.lang.vocab_size
    states, rows = [], []
    for tok, par in zip([None] + tokens, [None] + parents):
        s = state if tok is None else parser.advance(states[par + 1], tok)
        states.append(s)
        row = torch.full((v,), -math.inf if s is not None else 0.0, dtype=torch.float64)
        for t, p in (parser.probs(s).items() if s is not None else ()):
            row[t] = math.log(p)
        rows.append(row)
    return torch.stack(rows)


def sampling(temperature: float, seed: int, vocab: int) -> dict:
    return {"temperature": temperature, "top_k": 0, "top_p": 1.0, "seed": seed, "valid_vocab": vocab}


def test_the_exact_expectation_matches_the_tree_verification_sampled(world):
    """Monte Carlo of `tree_accept` at T = 1 (the verifier's own coins, seeds 0..n−1): the mean accepted length
    and each P(accepted ≥ j) within 4 standard errors of the exact values (seeds fixed: deterministic)."""
    lang, seqs = world
    n, checked = 3000, set()
    for i, s in enumerate(seqs[:3]):
        parser = Parser(lang, s.input_ids)
        for a in anchors(s, K, 5)[:2]:
            state = parser.states[a]
            tokens, parents = language_tree(parser, state, 12, seed=a)
            _, exact, _, reach = tree_accepted(parser, state, tokens, parents, K)
            logits = language_logits(parser, state, tokens, parents)
            lengths = np.array([len(tree_accept(logits, torch.tensor(tokens), torch.tensor(parents), a,
                                                sampling(1.0, seed, lang.vocab_size))[0]) for seed in range(n)])
            se = max(lengths.std(ddof=1), 1e-3) / math.sqrt(n)
            assert abs(lengths.mean() - exact) < 4 * se, (i, a, lengths.mean(), exact)
            for j in range(K):
                se_j = max(math.sqrt(reach[j] * (1 - reach[j]) / n), 1e-3)
                assert abs((lengths > j).mean() - reach[j]) < 4 * se_j, (i, a, j)
            checked.add(round(exact, 6))
    assert len(checked) > 3 and max(checked) > 1.0  # distinct anchors, trees that reach past depth 1


def test_greedy_depth_matches_the_tree_verification_at_t0(world):
    lang, seqs = world
    for s in seqs:
        parser = Parser(lang, s.input_ids)
        for a in anchors(s, K, 2):
            state = parser.states[a]
            tokens, parents = language_tree(parser, state, 10, seed=a)
            greedy = greedy_chain(parser, state, K)
            tokens[0] = greedy[0]  # some trees follow the greedy chain for a while
            acc0, _, _, _ = tree_accepted(parser, state, tokens, parents, K)
            path, _ = tree_accept(language_logits(parser, state, tokens, parents), torch.tensor(tokens),
                                  torch.tensor(parents), a, sampling(0.0, 0, lang.vocab_size))
            assert acc0 == len(path)


def test_a_single_path_tree_scores_as_its_chain(world):
    """Chains and trees count alike (γ = 1 + accepted, bonus not included): a chain drafted as a one-path tree."""
    lang, seqs = world
    chains, trees = {}, {}
    for i, s in enumerate(seqs):
        parser = Parser(lang, s.input_ids)
        for a in anchors(s, K, 3):
            m = marginals(parser, parser.states[a], K)
            chains[i, a] = [max(sorted(d), key=d.get) if j % 2 else min(d) for j, d in enumerate(m)]
            trees[i, a] = DraftTree(torch.tensor(chains[i, a]), torch.arange(-1, K - 1), torch.arange(1, K + 1),
                                    torch.zeros(K))
    chain, tree = score_drafts(lang, seqs, chains, K), score_trees(lang, seqs, trees, K)
    for kind in ("all", "bimodal", "forced", "free"):
        for t in (0, 1):
            assert np.allclose(tree.counts(kind, t), chain.counts(kind, t), rtol=1e-12, atol=0)
            assert np.allclose(tree.slot_rates(kind, t), chain.slot_rates(kind, t), rtol=1e-12, equal_nan=True)


def test_malformed_trees_are_refused(world):
    lang, seqs = world
    parser = Parser(lang, seqs[0].input_ids)
    state = parser.states[anchors(seqs[0], K)[0]]
    with pytest.raises(ValueError, match="parents: node 1 has parent 1"):
        tree_accepted(parser, state, [5, 6], [-1, 1], K)
    with pytest.raises(ValueError, match="3 levels deep, more than k = 2"):
        tree_accepted(parser, state, [5, 6, 7], [-1, 0, 1], 2)


class TreeDouble:
    """A tree drafter that checks what it is given (memory = tokens 0..a−1, the anchor, position a, the seed)
    and drafts the sequence's next tokens as one path."""

    def __init__(self, seqs):
        self.seqs, self.num_draft_tokens, self.target_layer_ids = seqs, K, ()

    def new_memory(self, batch_size, device):
        assert batch_size == 1
        return []

    def extend_memory(self, memory, token_ids, taps):
        memory += token_ids[0].tolist()

    def draft_tree(self, memory, anchor_token, position, *, depth, topk, num_nodes, seed=None):
        a = int(position[0])
        seq = next(s for s in self.seqs if s.input_ids[:a + 1] == memory + [int(anchor_token[0])])
        assert int(seed[0]) == 7 and (depth, topk, num_nodes) == (K, 4, 16)
        return DraftTree(torch.tensor(seq.input_ids[a + 1:a + 1 + depth]), torch.arange(-1, depth - 1),
                         torch.arange(1, depth + 1), torch.zeros(depth))


def test_trees_are_drafted_at_the_chain_anchors_with_the_loop_memory(world):
    lang, seqs = world
    double = TreeDouble(seqs)
    got = list(iter_trees({"x": double}, seqs, TreeSpec(K, 4, 16), stride=3, seed=7))
    assert [(i, a) for i, a, _, _ in got] == [(i, a) for i, s in enumerate(seqs) for a in anchors(s, K, 3)]
    tally = score_trees(lang, seqs, {(i, a): t for i, a, _, t in got}, K)
    assert tally.gamma("all", 0) < 1 + K  # the sampled sequences leave the greedy chain somewhere
    with pytest.raises(ValueError, match=r"x: tree depth must be in \[1, 4\]"):
        next(iter_trees({"x": double}, seqs, TreeSpec(K + 1, 4, 16)))


class BlockStub:
    num_draft_tokens, target_layer_ids = K, ()


class SelectorStub(BlockStub):
    candidate_selector = None


def test_tree_rows_are_the_bench_shapes_and_multi_noise_is_refused(world):
    rows = tree_drafters({"flow-1": BlockStub(), "DFlash2": SelectorStub(), "EAGLE-3": BlockStub()}, (16, 32), K)
    assert {name: (spec, base) for name, (_, spec, base) in rows.items()} == {
        f"{base} {kind} {n}": (TreeSpec(K, 4, n), base) for base, kind in
        (("flow-1", "top-k"), ("DFlash2", "top-k"), ("DFlash2", "selector")) for n in (16, 32)}
    lang, seqs = world
    with pytest.raises(ValueError, match="noisy: multi-noise trees"):
        tree_tallies(lang, seqs, {"noisy": (MultiNoiseDrafter(BlockStub()), TreeSpec(K, 2, 8), "x")}, K, 3)


def test_the_report_shows_tree_rows_and_their_paired_deltas():
    cell = {"gamma": 2.0, "interval": (1.5, 2.5)}
    row = {f"{kind}/t{t}": cell for kind in ("all", "bimodal", "forced", "free") for t in (0, 1)}
    trees = {"nodes": [16], "topk": 4, "rows": {"DFlash top-k 16": {**row, "nodes": 15.5}},
             "deltas": {"DFlash top-k 16 - DFlash": {f"{k}/t{t}": (0.25, (0.1, 0.4)) for k in ("all", "bimodal")
                                                     for t in (0, 1)}}}
    text = markdown({"prompts": 1, "anchors": 1, "options": {"block_size": K},
                     "target": {"model_entropy": 1.0, "true_entropy": 1.0}, "rows": {}, "ceilings": {},
                     "deltas": {}, "shuffle": {}, "diversity": {}, "curves": {}, "parameters": {}, "trees": trees})
    assert "| DFlash top-k 16 | 15.5 | 2.000 [1.500, 2.500] |" in text
    assert "| DFlash top-k 16 - DFlash | +0.250 [+0.100, +0.400] |" in text


def test_a_flashmap_tree_holds_its_chain_as_its_best_path():
    """Tree and chain rows share the round's noise draw: the top-k tree's best-first path (first child at every
    node) is the chain's draft, so their paired difference measures the extra branches only."""
    from conftest import tiny_qwen3
    from flashmap_ext.bench.methods import StepsDrafter
    from flashmap_ext.draft_shapes.block_tree import TopKTreeDrafter
    from flashmap_ext.evaluate.heldout import HeldoutSequence, add_taps, iter_drafts
    from flashmap_ext.target import Target
    from support.drafter_doubles import random_flashmap
    model = tiny_qwen3()
    g = torch.Generator().manual_seed(0)
    seqs = [HeldoutSequence("x", str(i), torch.randint(0, 111, (n,), generator=g).tolist(), [0] * 3 + [1] * (n - 3))
            for i, n in enumerate((14, 11))]
    add_taps(Target(model), seqs, [0, 1])
    drafter = StepsDrafter(random_flashmap(model, K, (0, 1)), 1)
    chains = {(i, a): d.tolist() for i, a, d in iter_drafts(drafter, seqs, K, seed=5)}
    trees = list(iter_trees({"t": TopKTreeDrafter(drafter)}, seqs, TreeSpec(K, 4, 16), seed=5))
    assert len(trees) == len(chains) > 10
    for i, a, _, tree in trees:
        toks, pars, path, node = tree.tokens.tolist(), tree.parents.tolist(), [], -1
        while node in pars:
            node = pars.index(node)
            path.append(toks[node])
        assert path == chains[i, a][:len(path)] and len(path) >= 1 and len(toks) == 16
