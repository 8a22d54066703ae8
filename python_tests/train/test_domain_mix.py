"""`--domain-weight DOMAIN=N --corpus DIR`: one epoch of the trainer's stream shows each sequence of DOMAIN N
times and the others once; every way to get it wrong is refused naming the flag."""
import argparse
import gzip
import json
from collections import Counter

import pytest

from flashmap_ext.cli import main
from flashmap_ext.train.domain_mix import DomainMix, domain_weight_arg, mixed
from flashmap_ext.train.features import FeatureCache
from flashmap_ext.train.trainer import chunk_indices
from python_tests.train.test_train_cli import tiny_feature_cache

IDS = ["sharegpt:a/0", "sharegpt:a/1", "asdiv:3/0", "codeio:9/0", "sharegpt:b/0"]
DOMAINS = {"sharegpt:a": "chat", "asdiv:3": "math", "codeio:9": "code", "sharegpt:b": "chat"}


@pytest.fixture(autouse=True)
def _raise_user_errors(monkeypatch):
    monkeypatch.setenv("FLASHMAP_DEBUG", "1")


def test_one_epoch_of_the_stream_shows_each_sequence_its_domains_weight_times():
    data = [f"item{i}" for i in range(len(IDS))]
    mix = DomainMix(data, IDS, DOMAINS, {"chat": 3, "code": 0})
    expected = {"item0": 3, "item1": 3, "item2": 1, "item4": 3}  # by hand: chat x3, math x1, code never
    assert len(mix) == sum(expected.values())
    epoch = Counter(mix[i] for i in chunk_indices(len(mix), seed=5, start=0, count=len(mix)))
    assert epoch == expected
    assert mix.summary() == "chat 3 -> 9, code 1 -> 0, math 1 -> 1"


def test_without_weights_the_dataset_is_unchanged():
    data = list(range(len(IDS)))
    assert mixed(data, IDS, None, None) is data


@pytest.mark.parametrize("corpus,weights,message", [
    (None, [("chat", 2)], r"^--domain-weight needs --corpus PATH"),
    (["c"], None, r"^--corpus c: read only for --domain-weight"),
    (["c"], [("chat", 2), ("chat", 3)], r"^--domain-weight chat is given twice"),
])
def test_missing_or_contradicting_flags_are_refused(corpus, weights, message):
    with pytest.raises(ValueError, match=message):
        mixed(list(range(len(IDS))), IDS, corpus, weights)


def test_a_domain_no_sequence_has_and_a_sequence_without_a_record_are_refused():
    data = list(range(len(IDS)))
    with pytest.raises(ValueError, match=r"^--domain-weight poetry: no cached sequence is of that domain "
                                         r"\(the corpus has chat, code, math\)"):
        DomainMix(data, IDS, DOMAINS, {"poetry": 2})
    with pytest.raises(ValueError, match=r"^--corpus c: 1 of the 5 cached sequences have no record .*'asdiv:3/0'"):
        DomainMix(data, IDS, {k: v for k, v in DOMAINS.items() if k != "asdiv:3"}, {"chat": 2}, "c")
    with pytest.raises(ValueError, match="every domain has weight 0"):
        DomainMix(data, IDS, DOMAINS, {"chat": 0, "code": 0, "math": 0})


@pytest.mark.parametrize("text", ["chat", "chat=", "=3", "chat=-1", "chat=1.5", "chat=x"])
def test_the_flag_wants_domain_equals_a_count(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected DOMAIN=N"):
        domain_weight_arg(text)
    assert domain_weight_arg(" chat = 3") == ("chat", 3)


def test_train_reads_the_domains_from_the_corpus_and_records_the_flag(tmp_path, capsys):
    common = tiny_feature_cache(tmp_path, ("one", "two", "three"))
    ids = FeatureCache(str(tmp_path / "f")).ids
    records = [{"id": i.rsplit("/", 1)[0], "domain": "chat" if n == 0 else "math", "messages": []}
               for n, i in enumerate(ids)]
    (tmp_path / "corpus").mkdir()
    with gzip.open(tmp_path / "corpus" / "part-00000.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    assert main(["train", "dflash", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
                 "--batch-size", "2", "--steps", "1", "--mask-token-id", "0", "--out", str(tmp_path / "run"),
                 "--domain-weight", "chat=4", "--corpus", str(tmp_path / "corpus")]) == 0
    assert f"sequences per epoch chat 1 -> 4, math {len(ids) - 1} -> {len(ids) - 1}" in capsys.readouterr().out
    args = json.loads((tmp_path / "run" / "run.json").read_text())["args"]
    assert args["domain_weight"] == [["chat", 4]] and args["corpus"] == [str(tmp_path / "corpus")]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_ids_are_matched_as_text_across_several_corpus_files(tmp_path):
    """`features` names the sequences of record 4 "4/0": a numeric id in the corpus must still be found, and a
    cache built from two files needs both (--corpus repeated)."""
    a = _jsonl(tmp_path / "a.jsonl", [{"id": 4, "domain": "chat"}, {"id": "x", "domain": "math"}])
    b = _jsonl(tmp_path / "b.jsonl", [{"id": "y", "domain": "code"}])
    mix = mixed(list("pqr"), ["4/0", "x/0", "y/0"], [a, b], [("chat", 2)])
    assert [mix[i] for i in range(len(mix))] == ["p", "p", "q", "r"]


def test_one_id_of_two_domains_and_a_missing_corpus_are_refused(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"id": "t:0", "domain": "math"}])
    b = _jsonl(tmp_path / "b.jsonl", [{"id": "t:0", "domain": "chat"}])
    with pytest.raises(ValueError, match=r"^--corpus .*b.jsonl: record 't:0' is of domain 'chat' there and 'math'"):
        mixed([0], ["t:0/0"], [a, b], [("chat", 2)])
    with pytest.raises(ValueError, match=r"^--corpus .*nope: no such file or folder"):
        mixed([0], ["t:0/0"], [str(tmp_path / "nope")], [("chat", 2)])


def test_a_corpus_root_is_refused_naming_the_subfolders_that_hold_parts(tmp_path):
    from flashmap_ext.train.store import read_records
    for split in ("heldout", "train"):
        (tmp_path / split).mkdir()
        with gzip.open(tmp_path / split / "part-00000.jsonl.gz", "wt") as f:
            f.write(json.dumps({"id": split, "domain": "chat"}) + "\n")
    with pytest.raises(ValueError, match=r"without corpus parts \(part-NNNNN.jsonl.gz\); its subfolders heldout, "
                                         r"train hold some"):
        list(read_records(tmp_path))
