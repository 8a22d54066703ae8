"""The synthetic language and its exact ceilings against brute-force enumeration of the generative story."""
from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict

import pytest

from flashmap_ext.synthetic.ceilings import NAMES, anchor_ceilings
from flashmap_ext.synthetic.greedy import greedy_corpus, segment_starts
from flashmap_ext.synthetic.language import BOS, EOS, Language, LanguageSpec, Parser, sample_corpus
from flashmap_ext.synthetic.testbed import heldout_sequences

TINY = LanguageSpec(seed=3, header=2, body=3, header_pool=2, num_sets=4, max_phrase=2, max_copy=2, filler=2,
                    phrase_pool=6, p_phrase=0.3, p_copy=0.2, filler_a=0.7)
K = 3


def story(lang: Language) -> dict[tuple, float]:
    """Every sequence with its probability, by following the generative story in the module docstring
    (reads only the language's tables: sets, succ, id ranges)."""
    s, out = lang.spec, defaultdict(float)
    copies = list(lang.copy_markers)

    def body(header, toks, p):
        if len(toks) >= s.body:
            out[tuple([BOS, *header, *toks, EOS])] += p
            return
        last = toks[-1] if toks else header[-1]
        for j, ps in enumerate(lang.sets):
            for alt, q in zip(ps.alternatives, ps.probs):
                body(header, toks + [lang.phrase_markers[j], *alt], p * s.p_phrase / s.num_sets * q)
        for i, marker in enumerate(copies):
            body(header, toks + [marker, *header[:2 + i]], p * s.p_copy / len(copies))
        a, b = lang.succ[last]
        rest = 1 - s.p_phrase - s.p_copy
        body(header, toks + [a], p * rest * s.filler_a)
        body(header, toks + [b], p * rest * (1 - s.filler_a))

    headers = list(itertools.permutations(lang.header_ids, s.header))  # distinct tokens, uniform
    for header in headers:
        body(list(header), [], 1.0 / len(headers))
    return dict(out)


@pytest.fixture(scope="module")
def world():
    lang = Language(TINY)
    return lang, story(lang)


def continuations(seqs: dict, prefix: tuple, k: int) -> dict[tuple, float]:
    """Joint law of the next k tokens after prefix (EOS repeats after the end), normalised."""
    out, n = defaultdict(float), len(prefix)
    for seq, p in seqs.items():
        if seq[:n] == prefix:
            out[(seq + (EOS,) * k)[n:n + k]] += p
    z = sum(out.values())
    return {c: p / z for c, p in out.items()}


def test_story_is_a_distribution_and_kinds_are_all_present(world):
    lang, seqs = world
    assert math.isclose(sum(seqs.values()), 1.0, rel_tol=1e-12)
    assert {ps.kind for ps in lang.sets} == {"disjoint", "swap", "crossing", "skewed"}


def test_next_probs_equal_the_story_conditionals(world):
    lang, seqs = world
    checked = 0
    for seq in list(seqs)[::7]:
        parser = Parser(lang, seq)
        for n in range(TINY.header + 1, len(seq)):
            got = parser.probs(parser.states[n - 1])
            want = continuations(seqs, seq[:n], 1)
            assert set(got) == {c[0] for c in want}
            for c, p in want.items():
                assert got[c[0]] == pytest.approx(p, rel=1e-12)
            checked += 1
    assert checked > 100


def test_sampled_sequences_have_positive_probability_and_are_deterministic(world):
    lang, seqs = world
    corpus = sample_corpus(lang, 200, seed=1)
    assert corpus == sample_corpus(lang, 200, seed=1)
    assert all(tuple(s) in seqs for s in corpus)
    big = Language(LanguageSpec())
    for seq in sample_corpus(big, 20, seed=0):
        assert None not in Parser(big, seq).states[big.spec.header:]
    assert Language(LanguageSpec()).sets == big.sets and Language(LanguageSpec(seed=1)).sets != big.sets


def brute_ceilings(seqs: dict, prefix: tuple, k: int) -> dict[str, dict[str, float]]:
    """The ceilings of ceilings.py by explicit sums over every draft tuple of the joint's support."""
    joint = continuations(seqs, prefix, k)

    mass = defaultdict(float)  # P(the continuation starts with this tuple)
    for c, p in joint.items():
        for j in range(k + 1):
            mass[c[:j]] += p

    def cond(path):  # p(path[-1] | prefix, path[:-1]) from the joint
        den = mass.get(tuple(path[:-1]), 0.0)
        return mass.get(tuple(path), 0.0) / den if den else 0.0

    def exp_t1(d):
        total, run = 0.0, 1.0
        for j in range(k):
            run *= cond(d[:j + 1]) if run else 0.0
            total += run
        return total

    marg = [defaultdict(float) for _ in range(k)]
    for c, p in joint.items():
        for j in range(k):
            marg[j][c[j]] += p
    greedy = []
    for _ in range(k):
        options = {c[len(greedy)] for c in joint if c[:len(greedy)] == tuple(greedy)}
        greedy.append(min(options, key=lambda t: (-cond(greedy + [t]), t)))
    ind = [min(m, key=lambda t: (-m[t], t)) for m in marg]
    run0 = next((j for j in range(k) if ind[j] != greedy[j]), k)
    lead = lambda d: sum(itertools.accumulate((float(d[j] == greedy[j]) for j in range(k)), lambda a, b: a * b))
    ind_s_t1 = sum(math.prod(marg[j][d[j]] for j in range(k)) * exp_t1(list(d))
                   for d in itertools.product(*[list(m) for m in marg]))
    ind_s_t0 = sum(math.prod(marg[j][d[j]] for j in range(k)) * lead(d)
                   for d in itertools.product(*[list(m) for m in marg]))
    return {"t0": {"independent_argmax": float(run0), "independent_sampled": ind_s_t0,
                   "joint_sampled": sum(p * lead(c) for c, p in joint.items()),
                   "joint_greedy": float(k), "joint_best": float(k)},
            "t1": {"independent_argmax": exp_t1(ind), "independent_sampled": ind_s_t1,
                   "joint_sampled": sum(p * exp_t1(list(c)) for c, p in joint.items()),
                   "joint_greedy": exp_t1(greedy), "joint_best": max(exp_t1(list(c)) for c in joint)}}


def test_ceilings_equal_brute_force(world):
    lang, seqs = world
    rng = random.Random(0)
    picks = rng.sample(sorted(seqs), 25)
    gaps = defaultdict(float)
    for seq in picks:
        parser = Parser(lang, seq)
        for n in range(TINY.header + 1, len(seq)):
            got = anchor_ceilings(parser, parser.states[n - 1], K)
            want = brute_ceilings(seqs, seq[:n], K)
            for t in ("t0", "t1"):
                for name in NAMES:
                    assert got[t][name] == pytest.approx(want[t][name], abs=1e-12), (seq[:n], t, name)
                gaps[t] = max(gaps[t], want[t]["joint_best"] - want[t]["independent_sampled"])
    assert gaps["t1"] > 0.1 and gaps["t0"] > 0.1  # the tiny language already separates the families


def test_incoherent_argmax_is_caught():
    """A crossing set right after its marker: independent argmax drafts [a, z] (z never follows a)."""
    lang = Language(LanguageSpec())
    j = next(i for i, ps in enumerate(lang.sets) if ps.kind == "crossing")
    seq = [BOS, *[lang.header_ids[0]] * lang.spec.header, lang.phrase_markers[j]]
    parser = Parser(lang, seq)
    c = anchor_ceilings(parser, parser.states[-1], 2)
    assert c["t0"]["independent_argmax"] == 1.0  # slot 1 'a' is greedy, slot 2 'z' is not
    assert c["t1"]["independent_argmax"] == pytest.approx(0.6)  # p(a) = 0.6, p(z | a) = 0
    assert c["t1"]["joint_best"] == pytest.approx(0.6 * 1.5)  # [a, x]: 0.6 + 0.6·0.5


def test_bad_spec_names_the_field():
    with pytest.raises(ValueError, match="max_copy"):
        LanguageSpec(max_copy=9)
    with pytest.raises(ValueError, match="tokens"):
        Parser(Language(LanguageSpec()), [5, 6])


def test_greedy_records_are_sampled_prompts_answered_by_the_story_greedy_chain(world):
    """Every answer token is the most likely next token under the story's conditionals (lowest id on ties), the
    answer opens at a segment start of a sequence of positive probability, and records are deterministic."""
    lang, seqs = world
    records = greedy_corpus(lang, 40, seed=4)
    assert records == greedy_corpus(lang, 40, seed=4)
    for tokens, c in records:
        assert tokens[-1] == EOS and tokens.count(EOS) == 1 and tuple(tokens) in seqs
        assert c in segment_starts(lang, tokens)
        for n in range(c + 1, len(tokens)):
            nxt = continuations(seqs, tuple(tokens[:n]), 1)
            best = max(nxt.values())
            assert tokens[n] == min(t for (t,), p in nxt.items() if math.isclose(p, best, rel_tol=1e-12))
    assert len({c - TINY.header for _, c in records}) > 1  # cuts vary


def test_greedy_heldout_loss_mask_covers_the_answer(world):
    lang, _ = world
    (seq,) = heldout_sequences(lang, 1, 4, "greedy")
    tokens, c = greedy_corpus(lang, 1, seed=4)[0]
    assert seq.input_ids == tokens and seq.loss_mask == [0] * c + [1] * (len(tokens) - c)
    with pytest.raises(ValueError, match="data"):
        heldout_sequences(lang, 1, 4, "beam")
