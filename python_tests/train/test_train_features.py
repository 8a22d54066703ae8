"""train/features.py: taps equal HF hidden states, shards round-trip, resume, flat memory."""
import json
import os

import pytest
import torch

from flashmap_ext.target.taps import compute_taps
from flashmap_ext.train.data import Sample
from flashmap_ext.train.features import FeatureCache, FeatureWriter, cache_features

LAYERS = [0, 2, 3]


def samples(n, vocab=111, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 5 + i % 7
        ids = torch.randint(0, vocab, (t,), generator=g).tolist()
        out.append(Sample(f"s{i}", ids, [0] * 3 + [1] * (t - 3)))
    return out


def hf_taps(model, ids, layers):
    """HF hidden_states[i + 1] (for the last layer that is after the final norm)."""
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0] for i in layers], -1)


def test_compute_taps_equal_hf_hidden_states(tiny_target):
    ids = samples(1)[0].input_ids
    torch.testing.assert_close(compute_taps(tiny_target, torch.tensor([ids]), [0, 2])[0],
                               hf_taps(tiny_target, ids, [0, 2]), rtol=0, atol=0)
    # the last layer's tap is HF's last hidden state, taken after the final norm (z-lab's convention)
    last = compute_taps(tiny_target, torch.tensor([ids]), [3])[0]
    torch.testing.assert_close(last, hf_taps(tiny_target, ids, [3]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="target_layer_ids: 4"):
        compute_taps(tiny_target, torch.tensor([ids]), [4])


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cache_roundtrip_across_shards(tiny_target, tmp_path, dtype):
    data = samples(9)
    n = cache_features(tiny_target, data, str(tmp_path), LAYERS, dtype=dtype, shard_tokens=20,
                       meta={"target": "tiny"}, progress=False)
    cache = FeatureCache(str(tmp_path))
    assert n == 9 and len(cache) == 9 and cache.meta["target"] == "tiny" and cache.meta["feature_dim"] == 192
    assert len({e["shard"] for e in cache.entries}) >= 3
    for s, item in zip(data, cache):
        assert item["id"] == s.id and item["input_ids"].tolist() == s.input_ids
        assert item["loss_mask"].tolist() == [bool(m) for m in s.loss_mask]
        assert item["taps"].dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        ref = compute_taps(tiny_target, torch.tensor([s.input_ids]), LAYERS)[0]
        torch.testing.assert_close(item["taps"], ref.to(item["taps"].dtype), rtol=0, atol=0)


def test_cache_view_of_a_subset_of_layers(tiny_target, tmp_path):
    """A cache of the union of taps read as one drafter's subset: the columns of those layers, in the
    order asked; a layer the cache lacks is an error naming it."""
    data = samples(3)
    cache_features(tiny_target, data, str(tmp_path), LAYERS, dtype="fp32", progress=False)
    view = FeatureCache(str(tmp_path), layers=[3, 0])
    assert view.meta["target_layer_ids"] == [3, 0] and view.meta["feature_dim"] == 128
    for s, item in zip(data, view):
        ref = compute_taps(tiny_target, torch.tensor([s.input_ids]), [3, 0])[0]
        torch.testing.assert_close(item["taps"], ref, rtol=0, atol=0)
    assert FeatureCache(str(tmp_path), layers=LAYERS)[0]["taps"].shape[1] == 192
    with pytest.raises(ValueError, match=r"layers \[1\] requested"):
        FeatureCache(str(tmp_path), layers=[0, 1])


def test_resume_after_interruption_matches_straight_run(tiny_target, tmp_path):
    data = samples(8)
    straight, resumed = tmp_path / "a", tmp_path / "b"
    cache_features(tiny_target, data, str(straight), LAYERS, shard_tokens=25, progress=False)
    cache_features(tiny_target, data[:5], str(resumed), LAYERS, shard_tokens=25, progress=False)
    last = max(int(p.name[5:10]) for p in resumed.glob("taps-*.bin"))
    with open(resumed / f"taps-{last:05d}.bin", "ab") as f:  # a killed write: bytes without an index line
        f.write(b"\x01" * 1000)
    with open(resumed / "index.jsonl", "a") as f:
        f.write('{"id": "s5", "sha')  # and a torn index line
    calls = []
    hook = tiny_target.model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    assert cache_features(tiny_target, data, str(resumed), LAYERS, shard_tokens=25, progress=False) == 3
    hook.remove()
    assert len(calls) == 3
    a, b = FeatureCache(str(straight)), FeatureCache(str(resumed))
    assert a.entries == b.entries
    for x, y in zip(a, b):
        assert x["id"] == y["id"] and torch.equal(x["taps"].float(), y["taps"].float())
    with pytest.raises(ValueError, match="target_layer_ids"):
        cache_features(tiny_target, data, str(resumed), [1], progress=False)


def test_a_failed_first_call_leaves_no_settings_behind(tiny_target, tmp_path):
    """A cache holding no sequence yet takes the next call's settings (its manifest is replaced)."""
    with pytest.raises(ValueError, match="target_layer_ids: 4"):
        cache_features(tiny_target, samples(2), str(tmp_path), [4], progress=False)
    assert cache_features(tiny_target, samples(2), str(tmp_path), [1], progress=False) == 2
    assert FeatureCache(str(tmp_path)).meta["target_layer_ids"] == [1]


def test_count_token_counts_the_indexed_ids_of_every_shard(tmp_path):
    """Token 7 occurs 2 + 0 + 3 times in three sequences over two shards of 11 rows; ids past the last indexed
    row (a torn write) do not count."""
    seqs = [[7, 1, 7, 2, 3], [1, 2, 3, 4, 5, 6], [7, 7, 0, 7]]
    with FeatureWriter(str(tmp_path), {"target_layer_ids": [0], "feature_dim": 2, "dtype": "fp32"},
                       shard_tokens=11) as w:
        for i, ids in enumerate(seqs):
            w.add(f"s{i}", ids, [1] * len(ids), torch.zeros(len(ids), 2))
    with open(tmp_path / "ids-00001.bin", "ab") as f:
        f.write(torch.tensor([7, 7], dtype=torch.int32).numpy().tobytes())
    cache = FeatureCache(str(tmp_path))
    assert [int(e["shard"]) for e in cache.entries] == [0, 0, 1]
    assert (cache.count_token(7), cache.count_token(1), cache.count_token(9)) == (5, 2, 0)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_writer_memory_flat_in_number_of_sequences(tmp_path):
    feat, t = 4096, 64  # 512 KiB of fp16 taps per sequence, 48 MiB over the run
    w = FeatureWriter(str(tmp_path), {"target_layer_ids": [0], "feature_dim": feat, "dtype": "fp16"},
                      shard_tokens=t * 40)
    taps = torch.randn(t, feat)
    for i in range(96):
        if i == 8:
            base = _rss_bytes()
        w.add(f"s{i}", [1] * t, [1] * t, taps)
    growth = _rss_bytes() - base
    w.close()
    assert growth < 8 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 88 sequences of 0.5 MiB"
    assert len(FeatureCache(str(tmp_path))) == 96
    assert json.loads((tmp_path / "manifest.json").read_text())["dtype"] == "fp16"


def ref_topk(model, ids, k):
    """float64 reference: the top-k log-probabilities of the HF model's own logits, ids, and the rest's log-mass."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    top, top_ids = logp.topk(k, -1)
    rest = torch.log(1 - top.exp().sum(-1))
    return top, top_ids, rest


def test_soft_labels_round_trip_against_the_hf_logits(tiny_target, tmp_path):
    data = samples(6)
    cache_features(tiny_target, data, str(tmp_path), LAYERS, dtype="bf16", shard_tokens=20, progress=False, topk=5)
    cache = FeatureCache(str(tmp_path))
    assert cache.topk == 5 and cache.meta["topk"] == 5 and len({e["shard"] for e in cache.entries}) >= 2
    for s, item in zip(data, cache):
        top, top_ids, rest = ref_topk(tiny_target, s.input_ids, 5)
        assert item["topk_logp"].dtype == torch.float16 and item["topk_logp"].shape == (len(s.input_ids), 6)
        assert torch.equal(item["topk_ids"], top_ids)  # ids over the full vocabulary, largest first
        torch.testing.assert_close(item["topk_logp"][:, :5].double(), top, atol=4e-3, rtol=1e-3)  # fp16
        torch.testing.assert_close(item["topk_logp"][:, 5].double(), rest, atol=4e-3, rtol=1e-3)
        assert (item["topk_logp"].double().exp().sum(-1) - 1).abs().max() < 5e-3  # the rest's mass is kept


def test_soft_label_cache_resumes_and_refuses_another_k(tiny_target, tmp_path):
    data = samples(7)
    straight, resumed = tmp_path / "a", tmp_path / "b"
    cache_features(tiny_target, data, str(straight), LAYERS, shard_tokens=25, progress=False, topk=3)
    cache_features(tiny_target, data[:4], str(resumed), LAYERS, shard_tokens=25, progress=False, topk=3)
    last = max(int(p.name[9:14]) for p in resumed.glob("topk_ids-*.bin"))
    with open(resumed / f"topk_ids-{last:05d}.bin", "ab") as f:  # a killed write past the last index line
        f.write(b"\x02" * 100)
    assert cache_features(tiny_target, data, str(resumed), LAYERS, shard_tokens=25, progress=False, topk=3) == 3
    for x, y in zip(FeatureCache(str(straight)), FeatureCache(str(resumed))):
        assert torch.equal(x["topk_ids"], y["topk_ids"]) and torch.equal(x["topk_logp"], y["topk_logp"])
    with pytest.raises(ValueError, match="topk=3, asked for 4"):
        cache_features(tiny_target, data, str(resumed), LAYERS, progress=False, topk=4)
    with pytest.raises(ValueError, match="topk=3, asked for None"):
        cache_features(tiny_target, data, str(resumed), LAYERS, progress=False)


def _hold_lock(root, ready, release):
    """Child process: opens a writer on `root` and keeps it open until `release` is set."""
    w = FeatureWriter(root, {"target_layer_ids": [0], "feature_dim": 4, "dtype": "fp32"})
    ready.set()
    release.wait(60)
    w.close()


def test_a_second_writer_of_one_cache_is_refused_until_the_first_ends(tmp_path):
    import multiprocessing as mp

    from flashmap_ext.train.features import CacheBusy
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    child.start()
    try:
        assert ready.wait(120), "child writer did not start"
        meta = {"target_layer_ids": [0], "feature_dim": 4, "dtype": "fp32"}
        with pytest.raises(CacheBusy, match=f"pid {child.pid}.*another --out"):
            FeatureWriter(str(tmp_path), meta)
        release.set()
        child.join(60)
        assert child.exitcode == 0
        with FeatureWriter(str(tmp_path), meta) as w:  # the lock went with the first writer
            w.add("s0", [1, 2], [0, 1], torch.ones(2, 4))
        assert len(FeatureCache(str(tmp_path))) == 1
    finally:
        release.set()
        child.join(60)


def test_one_process_cannot_open_two_writers_of_one_cache(tmp_path):
    from flashmap_ext.train.features import CacheBusy
    meta = {"target_layer_ids": [0], "feature_dim": 4, "dtype": "fp32"}
    with FeatureWriter(str(tmp_path), meta) as w:
        with pytest.raises(CacheBusy):
            FeatureWriter(str(tmp_path), meta)
        w.add("s0", [1, 2], [0, 1], torch.ones(2, 4))
    with pytest.raises(ValueError, match="dtype"):  # a refused writer does not keep the lock either
        FeatureWriter(str(tmp_path), {**meta, "dtype": "bf16"})
    FeatureWriter(str(tmp_path), meta).close()
