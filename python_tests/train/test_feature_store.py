"""Feature store (train/feature_store.py) and batched prefill (train/features.py): batched taps equal the
unbatched ones; extending the store with a grown corpus equals building it from scratch; the keys move with
the parts, the target and the taps. Tiny fp32 targets, byte tokenizer, temporary store."""
import json

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.target.taps import compute_taps
from flashmap_ext.target.tiny import ByteTokenizer
from flashmap_ext.train import feature_store
from flashmap_ext.train.data import Sample
from flashmap_ext.train.features import FeatureCache, cache_features, prefill_batches
from flashmap_ext.train.store import ShardWriter

LAYERS = [0, 2, 3]


def samples(n, vocab=111, seed=2):
    g = torch.Generator().manual_seed(seed)
    lengths = [3 + (7 * i) % 29 for i in range(n)]
    return [Sample(f"s{i}", torch.randint(0, vocab, (t,), generator=g).tolist(), [0] * 2 + [1] * (t - 2))
            for i, t in enumerate(lengths)]


def test_batched_prefill_taps_equal_one_sequence_at_a_time(tiny_target, tmp_path):
    data = samples(23)
    n = cache_features(tiny_target, data, str(tmp_path / "b"), LAYERS, dtype="fp32", progress=False,
                       batch_tokens=96, window=8)
    cache = FeatureCache(str(tmp_path / "b"))
    assert n == 23 and sorted(cache.ids) == sorted(s.id for s in data)
    by_id = {s.id: s for s in data}
    for item in cache:
        s = by_id[item["id"]]
        ref = compute_taps(tiny_target, torch.tensor([s.input_ids]), LAYERS)[0]   # unbatched, unpadded
        assert item["input_ids"].tolist() == s.input_ids
        torch.testing.assert_close(item["taps"], ref, rtol=1e-5, atol=1e-5)


def test_prefill_batches_respect_the_token_budget_and_keep_every_sample():
    data = samples(40)
    batches = list(prefill_batches(data, batch_tokens=64, window=16))
    assert sorted(s.id for b in batches for s in b) == sorted(s.id for s in data)
    for b in batches:
        width = max(len(s.input_ids) for s in b)
        assert len(b) == 1 or len(b) * width <= 64
    with pytest.raises(ValueError, match="batch_tokens"):
        list(prefill_batches(data, batch_tokens=0, window=4))


def corpus(folder, start, stop):
    """Records q<start>..q<stop-1> appended to a corpus folder (3 per part), as `data generate` writes them."""
    w = ShardWriter(folder, records_per_part=3, flush_every=1)
    for i in range(start, stop):
        w.add({"id": f"q{i}", "messages": [{"role": "user", "content": f"what is {i} times {i + 1}?"},
                                           {"role": "assistant", "content": f"it is {i * (i + 1)}, of course"}]})
    w.close()


def build(model, data, root, layers=LAYERS):
    return feature_store.build(model, ByteTokenizer(), str(data), layers, dtype="fp32", target_dtype="fp32",
                               max_length=None, root=str(root), progress=False, log=lambda *_: None)


def read_all(view):
    cache = FeatureCache(view)
    return {item["id"]: (item["input_ids"].tolist(), item["taps"]) for item in cache}


def test_extending_with_new_parts_equals_a_full_rebuild(tmp_path):
    model = tiny_qwen3(vocab_size=300)
    corpus(tmp_path / "c", 0, 5)                 # parts 0 (q0-q2) and 1 (q3-q4)
    first = build(model, tmp_path / "c", tmp_path / "store")
    assert len(FeatureCache(first)) == 5
    corpus(tmp_path / "c", 5, 8)                 # part 1 grows (q5), part 2 is new (q6, q7)
    grown = build(model, tmp_path / "c", tmp_path / "store")
    assert grown != first and len(FeatureCache(first)) == 5          # the old view is left as it was
    full = build(model, tmp_path / "c", tmp_path / "fresh")
    a, b = read_all(grown), read_all(full)
    assert sorted(a) == sorted(b) == sorted(f"q{i}/0" for i in range(8))   # one sample per answer turn
    for k in a:
        assert a[k][0] == b[k][0]
        torch.testing.assert_close(a[k][1], b[k][1], rtol=1e-5, atol=1e-5)
    assert build(model, tmp_path / "c", tmp_path / "store") == grown  # nothing new: the same view


def test_a_rewritten_part_is_refused(tmp_path):
    model = tiny_qwen3(vocab_size=300)
    corpus(tmp_path / "c", 0, 2)
    build(model, tmp_path / "c", tmp_path / "store")
    part = sorted((tmp_path / "c").glob("part-*"))[0]
    other = tmp_path / "d"
    corpus(other, 0, 1)                          # same first record, so the same part key ...
    w = ShardWriter(other, records_per_part=3, flush_every=1)
    w.add({"id": "q1", "messages": [{"role": "user", "content": "a different question"},
                                    {"role": "assistant", "content": "a different answer"}]})
    w.close()
    assert feature_store.part_key(part) == feature_store.part_key(sorted(other.glob("part-*"))[0])
    with pytest.raises(ValueError, match="'q1/0' is cached with other tokens"):   # ... but q1's tokens differ
        build(model, other, tmp_path / "store")


def test_keys_change_with_parts_target_and_taps(tmp_path):
    a, b = tiny_qwen3(vocab_size=300, seed=0), tiny_qwen3(vocab_size=300, seed=1)
    fa, fb = feature_store.target_fingerprint(a), feature_store.target_fingerprint(b)
    assert fa != fb and fa == feature_store.target_fingerprint(tiny_qwen3(vocab_size=300, seed=0))
    kw = dict(dtype="bf16", target_dtype="bf16", max_length=384, enable_thinking=False, topk=0)
    base = feature_store.config_key(fa, [1, 2], **kw)[0]
    assert feature_store.config_key(fa, [1, 2], **kw)[0] == base
    assert feature_store.config_key(fb, [1, 2], **kw)[0] != base
    assert feature_store.config_key(fa, [1, 3], **kw)[0] != base
    assert feature_store.config_key(fa, [1, 2], **{**kw, "max_length": 512})[0] != base
    assert feature_store.config_key(fa, [1, 2], **{**kw, "dtype": "fp32"})[0] != base
    corpus(tmp_path / "c", 0, 3)
    corpus(tmp_path / "d", 10, 13)
    pc, pd = (sorted((tmp_path / x).glob("part-*"))[0] for x in "cd")
    assert pc.name == pd.name and feature_store.part_key(pc) != feature_store.part_key(pd)
    va, vb = build(a, tmp_path / "c", tmp_path / "s"), build(b, tmp_path / "c", tmp_path / "s")
    assert va != vb                                             # another target: another config folder
    assert build(a, tmp_path / "c", tmp_path / "s", layers=[0, 3]) != va
    assert build(a, tmp_path / "d", tmp_path / "s") != va       # other parts: another view
    assert json.loads((tmp_path / "s" / va.split("/")[-3] / "config.json").read_text())["layers"] == LAYERS


def test_features_store_command_links_the_view_and_train_reads_it(tmp_path, monkeypatch, capsys):
    """`flashmap features --store`: the store under FLASHMAP_CACHE, --out a link to its view; a rerun after
    the corpus grew computes only the new sequences; a folder at --out is refused in one line."""
    from flashmap_ext.cli import main
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "assets"))
    corpus(tmp_path / "c", 0, 4)
    argv = ["features", "--target", "tiny-random", "--data", str(tmp_path / "c"), "--out", str(tmp_path / "f"),
            "--store", "--no-progress", "--batch-tokens", "256"]
    assert main(argv) == 0
    link = tmp_path / "f"
    assert link.is_symlink() and str(link.resolve()).startswith(str(tmp_path / "assets" / "features"))
    assert len(FeatureCache(str(link))) == 4
    corpus(tmp_path / "c", 4, 6)
    assert main(argv) == 0 and len(FeatureCache(str(link))) == 6
    assert main(["train", "flow", "--target", "tiny-random", "--no-progress", "--features", str(link), "--preset",
                 "cpu-tiny", "--batch-size", "2", "--out", str(tmp_path / "flow"), "--steps", "1",
                 "--no-head-recompute"]) == 0
    (tmp_path / "g").mkdir()
    assert main([*argv[:6], str(tmp_path / "g"), *argv[7:]]) != 0
    assert "g: something that is not a link is there" in capsys.readouterr().err


def test_an_unchanged_part_is_not_read_again_and_a_grown_one_is(tmp_path, monkeypatch):
    """Finding the store again costs a file digest per part, not a tokenisation of the corpus; a part whose
    bytes changed (it grew) is read and extended as before."""
    from flashmap_ext.train import data as data_mod
    model = tiny_qwen3(vocab_size=300)
    corpus(tmp_path / "c", 0, 5)
    first = build(model, tmp_path / "c", tmp_path / "store")
    read = []
    real = data_mod.load_samples
    monkeypatch.setattr(data_mod, "load_samples", lambda path, *a, **kw: read.append(path) or real(path, *a, **kw))
    assert build(model, tmp_path / "c", tmp_path / "store") == first and read == []
    corpus(tmp_path / "c", 5, 6)                 # part 1 grows (q3, q4 + q5)
    grown = build(model, tmp_path / "c", tmp_path / "store")
    assert [p.split("/")[-1] for p in read] == ["part-00001.jsonl.gz"]
    assert sorted(read_all(grown)) == sorted(f"q{i}/0" for i in range(6))
