"""Greedy-answer data for the testbed (DESIGN.md §13): prompts sampled from the language, answers its greedy chain.

The real recipe trains drafters on the target's own greedy answers, and at T = 0 verification follows the same
greedy chain. The testbed's verifier is the language itself (the small Qwen3 only supplies the taps), so a
greedy answer here is the language's greedy chain (`ceilings.greedy_chain`: the lowest id on ties, exactly what the
T = 0 verifier accepts). A record is cut from a sampled sequence at a segment start c (a phrase marker, a copy
marker or a filler token, uniformly among the body's segment starts): the prompt is tokens 0..c−1, the answer is
token c (so the decision it opens is an answer anchor, as a real answer's own tokens are) followed by the greedy
chain from there to EOS. Token c is never a label: an anchor needs an answer token before its labels.
"""
from __future__ import annotations

import random

from flashmap_ext.synthetic.ceilings import argmax
from flashmap_ext.synthetic.language import EOS, Language, Parser, sample_sequence


def segment_starts(lang: Language, tokens: list[int]) -> list[int]:
    """Body positions whose token starts a segment (the state before it is free): markers and filler tokens."""
    parser, h = Parser(lang, tokens), lang.spec.header
    return [i for i in range(h + 1, len(tokens)) if tokens[i] != EOS and parser.states[i - 1][0] == "free"]


def greedy_answer(lang: Language, prefix: list[int]) -> list[int]:
    """`prefix` (BOS, header, body tokens of positive probability) followed by the language's greedy chain to EOS."""
    parser = Parser(lang, prefix)
    state, out = parser.states[-1], list(prefix)
    if state is None:
        raise ValueError("prefix: holds a token of probability 0 in the language")
    while out[-1] != EOS:
        out.append(argmax(parser.probs(state)))
        state = lang.step(state, out[-1])
    return out


def greedy_record(lang: Language, rng: random.Random) -> tuple[list[int], int]:
    """(tokens, c): one sequence of a sampled prompt and a greedy answer, answer tokens from position c on."""
    while True:
        sampled = sample_sequence(lang, rng)
        starts = segment_starts(lang, sampled)
        if starts:
            c = rng.choice(starts)
            return greedy_answer(lang, sampled[:c + 1]), c


def greedy_corpus(lang: Language, n: int, seed: int) -> list[tuple[list[int], int]]:
    """n records of `greedy_record` from `random.Random(seed)` (deterministic)."""
    rng = random.Random(seed)
    return [greedy_record(lang, rng) for _ in range(n)]
