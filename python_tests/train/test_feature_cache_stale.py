"""Feature caches never serve a sequence the corpus no longer holds as cached: a store part that lost a
record, a plain cache whose conversation was edited, a rerun with another --max-length, a plain run
writing through a link into the store. Each is refused in one line naming the part or the option. Tiny
fp32 targets, byte tokenizer, temporary store and asset cache."""
import gzip
import json
import os
import shutil

import pytest
from test_feature_store import build, corpus, read_all

from conftest import tiny_qwen3
from flashmap_ext import cli
from flashmap_ext.train import feature_store
from flashmap_ext.train.features import FeatureCache


def rewrite_part(part, keep):
    """Rewrites a corpus part with only the records whose id is in `keep` (its first record stays first)."""
    with gzip.open(part, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    with gzip.open(part, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records if r["id"] in keep)


@pytest.mark.parametrize("keep, gone", [({"q0", "q2"}, "q1/0"),     # a record deleted from the middle
                                        ({"q0", "q1"}, "q2/0")])    # the same file cut short
def test_a_part_that_lost_a_record_is_refused(tmp_path, keep, gone):
    model = tiny_qwen3(vocab_size=300)
    corpus(tmp_path / "c", 0, 5)                 # parts 0 (q0-q2) and 1 (q3-q4)
    build(model, tmp_path / "c", tmp_path / "store")
    part = tmp_path / "c" / "part-00000.jsonl.gz"
    key = feature_store.part_key(part)
    rewrite_part(part, keep)
    assert feature_store.part_key(part) == key   # the same part key: only the sequences tell
    with pytest.raises(ValueError) as err:
        build(model, tmp_path / "c", tmp_path / "store")
    msg = str(err.value)
    assert "\n" not in msg and f"{part}:" in msg and repr(gone) in msg and "remove its folder" in msg
    cached = next((tmp_path / "store").glob(f"*/parts/{key}"))
    shutil.rmtree(cached)                        # as the message says: then the part is cached anew
    view = build(model, tmp_path / "c", tmp_path / "store")
    assert sorted(read_all(view)) == sorted(f"{r}/0" for r in keep | {"q3", "q4"})


def conversations(path, answers):
    """A conversations jsonl with records r0, r1, ... answering each question with `answers[i]`."""
    with open(path, "w") as f:
        for i, answer in enumerate(answers):
            f.write(json.dumps({"id": f"{path.stem}{i}", "messages": [
                {"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": answer}]}) + "\n")


def features(data, out, *extra):
    return ["features", "--target", "tiny-random", "--data", str(data), "--out", str(out), "--no-progress",
            "--device", "cpu", "--batch-tokens", "256", *extra]


def one_line_error(argv, capsys) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


def test_a_plain_cache_refuses_an_edited_answer_and_keeps_other_files(tmp_path, capsys):
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "f"
    conversations(a, ["one", "two", "three"])
    conversations(b, ["four", "five"])
    assert cli.main(features(a, out)) == 0
    assert cli.main(features(b, out)) == 0       # another file's sequences into the same cache: fine
    assert cli.main(features(a, out)) == 0       # nothing changed: nothing refused
    assert sorted(FeatureCache(str(out)).ids) == ["a0/0", "a1/0", "a2/0", "b0/0", "b1/0"]
    capsys.readouterr()
    conversations(a, ["one", "TWO, edited", "three"])
    err = one_line_error(features(a, out), capsys)
    assert f"--out {out}" in err and "'a1/0' is cached with other tokens" in err and f"--data {a}" in err


def test_a_plain_cache_refuses_another_max_length(tmp_path, capsys):
    a, out = tmp_path / "a.jsonl", tmp_path / "f"
    conversations(a, ["one", "two"])
    assert cli.main(features(a, out)) == 0       # --max-length 3072, the default
    manifest = (out / "manifest.json").read_text()
    capsys.readouterr()
    err = one_line_error(features(a, out, "--max-length", "40"), capsys)
    assert "--max-length" in err and "max_length=3072, asked for 40" in err
    assert (out / "manifest.json").read_text() == manifest


def test_a_plain_run_does_not_write_through_a_store_link(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "assets"))
    corpus(tmp_path / "c", 0, 2)
    link = tmp_path / "f"
    assert cli.main(features(tmp_path / "c", link, "--store")) == 0
    view = os.path.realpath(link)
    sizes = {p: os.path.getsize(os.path.join(view, p)) for p in os.listdir(view)}
    other = tmp_path / "other.jsonl"
    conversations(other, ["not a corpus record"])
    capsys.readouterr()
    for out in (link, view):                     # the link --store made, or the view it points at
        err = one_line_error(features(other, out), capsys)
        assert f"--out {out}:" in err and "use --store, or another folder" in err
    assert {p: os.path.getsize(os.path.join(view, p)) for p in os.listdir(view)} == sizes
    assert len(FeatureCache(view)) == 2


def test_a_layer_the_target_lacks_is_refused_before_the_cache_is_written(tmp_path, capsys):
    a, out = tmp_path / "a.jsonl", tmp_path / "f"
    conversations(a, ["one", "two"])
    err = one_line_error(features(a, out, "--layers", "10"), capsys)
    assert err.startswith("flashmap features: error: --layers: must be in [0, 4) (got 10)")
    assert not (out / "manifest.json").exists()
    assert cli.main(features(a, out, "--layers", "1")) == 0
    assert FeatureCache(str(out)).meta["target_layer_ids"] == [1]
