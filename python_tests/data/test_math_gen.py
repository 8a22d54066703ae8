"""The procedural math prompt source (data/math_gen.py, `data generate --source mathgen`): deterministic
texts, every family present, algebra written out as a person would, and the corpus rules applied."""
import re

from flashmap_ext.assets.sharegpt import _words
from flashmap_ext.data.math_gen import FAMILIES, MATHGEN, GeneratedSet, _poly
from flashmap_ext.data.prompts import packaged_prompts, usable

SMALL = GeneratedSet("mathgen", "math", MATHGEN.source, MATHGEN.licence, 420)


def test_item_i_is_the_same_text_whatever_the_count():
    a, b = SMALL.items(), GeneratedSet("mathgen", "math", "s", "l", 63).items()
    assert a[:63] == b and a == SMALL.items()
    assert len({i for i, _ in a}) == 420
    assert {i.rsplit("-", 1)[0] for i, _ in a} == {name for name, _ in FAMILIES}


def test_texts_are_usable_prompts_with_whole_algebra():
    texts = [t for _, t in SMALL.items()]
    assert all(usable(t, 20, 1500) for t in texts)
    assert len(set(texts)) >= 0.9 * len(texts)
    for t in texts:   # no '+ -3', no '1x', no '0x' in an equation
        assert not re.search(r"[+-] -\d|\b1x\b|\b0x\b|\b1y\b", t), t


def test_poly_writes_terms_as_written_by_hand():
    assert _poly((3, "x"), (-1, "y"), (5, "")) == "3x - y + 5"
    assert _poly((1, "x^2"), (-7, "x"), (12, "")) == "x^2 - 7x + 12"
    assert _poly((-1, "x"), (0, "y"), (-4, "")) == "-x - 4"
    assert _poly((0, "x")) == "0"


def test_the_corpus_rules_apply_to_the_set():
    items = SMALL.items()
    bench = items[5][1]                                  # an item that is a "benchmark" prompt: dropped
    grams = {tuple(_words(bench)[:13])}
    recs = [r for w in ("train", "heldout") for r in packaged_prompts(items, SMALL, w, grams)]
    assert bench not in {r["messages"][0]["content"] for r in recs}
    assert {r["domain"] for r in recs} == {"math"} and {r["licence"] for r in recs} == {SMALL.licence}
    assert all(r["id"].startswith("mathgen:") for r in recs)
    assert any(r["split"] == "heldout" for r in recs) and any(r["split"] == "train" for r in recs)
