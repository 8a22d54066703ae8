"""train/feature_merge.py: caches made in parallel merge into one that reads back every sequence unchanged."""
import pytest
import torch

from flashmap_ext.train.feature_merge import main, merge_feature_caches
from flashmap_ext.train.features import FeatureCache, FeatureWriter

META = {"target_layer_ids": [1, 3], "hidden_size": 4, "feature_dim": 8, "dtype": "fp32"}


def write_cache(root, names, seed, shard_tokens=12, meta=META):
    """Random sequences (5-9 tokens) written through FeatureWriter; returns {id: (ids, mask, taps)}."""
    g = torch.Generator().manual_seed(seed)
    made = {}
    with FeatureWriter(str(root), meta, shard_tokens) as w:
        for name in names:
            t = int(torch.randint(5, 10, (1,), generator=g))
            ids = torch.randint(0, 50, (t,), generator=g).tolist()
            mask = [0, 0] + [1] * (t - 2)
            taps = torch.randn(t, meta["feature_dim"], generator=g)
            w.add(name, ids, mask, taps)
            made[name] = (ids, mask, taps)
    return made


def check_equal(cache, made):
    assert sorted(cache.ids) == sorted(made)
    for i, name in enumerate(cache.ids):
        ids, mask, taps = made[name]
        item = cache[i]
        assert item["input_ids"].tolist() == ids and item["loss_mask"].int().tolist() == mask
        torch.testing.assert_close(item["taps"], taps, rtol=0, atol=0)


def test_merge_reads_back_every_sequence(tmp_path):
    a = write_cache(tmp_path / "a", [f"a{i}" for i in range(7)], seed=1)   # several shards each
    b = write_cache(tmp_path / "b", [f"b{i}" for i in range(5)], seed=2)
    assert merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a"), str(tmp_path / "b")]) == 12
    check_equal(FeatureCache(str(tmp_path / "out")), {**a, **b})
    # a rerun of the same merge adds nothing and leaves the cache as it was
    assert merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    check_equal(FeatureCache(str(tmp_path / "out")), {**a, **b})


def test_merged_cache_resumes_writing(tmp_path):
    a = write_cache(tmp_path / "a", ["a0", "a1", "a2"], seed=3)
    merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a")])
    c = write_cache(tmp_path / "out", ["c0", "c1"], seed=4)  # FeatureWriter appends to the merged cache
    check_equal(FeatureCache(str(tmp_path / "out")), {**a, **c})


def test_merge_refuses_other_taps_and_clashing_ids(tmp_path):
    write_cache(tmp_path / "a", ["x", "y"], seed=1)
    write_cache(tmp_path / "b", ["z"], seed=2, meta={**META, "target_layer_ids": [1, 2]})
    write_cache(tmp_path / "c", ["y", "w"], seed=3)
    with pytest.raises(ValueError, match="target_layer_ids"):
        merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a"), str(tmp_path / "b")])
    assert len(FeatureCache(str(tmp_path / "out"))) == 0  # refused before anything was written
    with pytest.raises(ValueError, match="'y'"):
        merge_feature_caches(str(tmp_path / "out2"), [str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        merge_feature_caches(str(tmp_path / "out3"), [str(tmp_path / "nothing")])


def test_cli_error_names_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "o"), str(tmp_path / "missing")])
    assert e.value.code == 2 and "no manifest.json" in capsys.readouterr().err


def test_merge_carries_soft_labels_and_refuses_mixing_them(tmp_path):
    meta = {**META, "topk": 2}
    for name, seed in (("a", 5), ("b", 6)):
        g = torch.Generator().manual_seed(seed)
        with FeatureWriter(str(tmp_path / name), meta, shard_tokens=10) as w:
            for i in range(3):
                logp, ids = torch.randn(6, 3, generator=g), torch.randint(0, 50, (6, 2), generator=g)
                w.add(f"{name}{i}", list(range(6)), [1] * 6, torch.randn(6, 8, generator=g), (logp, ids))
    merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a"), str(tmp_path / "b")])
    merged = FeatureCache(str(tmp_path / "out"))
    for src in ("a", "b"):
        for item in FeatureCache(str(tmp_path / src)):
            other = merged[merged.ids.index(item["id"])]
            assert torch.equal(other["topk_ids"], item["topk_ids"]) and torch.equal(other["topk_logp"], item["topk_logp"])
    write_cache(tmp_path / "plain", ["p0"], seed=7)
    with pytest.raises(ValueError, match="topk"):
        merge_feature_caches(str(tmp_path / "out2"), [str(tmp_path / "a"), str(tmp_path / "plain")])


def test_merge_refuses_a_cache_that_a_writer_has_open(tmp_path):
    from flashmap_ext.train.features import CacheBusy
    made = write_cache(tmp_path / "a", ["a0", "a1"], seed=1)
    with FeatureWriter(str(tmp_path / "out"), META):  # a `flashmap features` still writing the destination
        with pytest.raises(CacheBusy, match="another process"):
            merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a")])
    with FeatureWriter(str(tmp_path / "a"), META):  # or still writing a source
        with pytest.raises(CacheBusy):
            merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a")])
    assert merge_feature_caches(str(tmp_path / "out"), [str(tmp_path / "a")]) == 2
    check_equal(FeatureCache(str(tmp_path / "out")), made)
