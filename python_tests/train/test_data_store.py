"""jsonl.gz corpus parts (flashmap_ext.train.store): append, rotate, resume, torn tails, snapshots."""
import gzip
import json

import pytest

from flashmap_ext.train.store import ShardWriter, copy_complete, parts, read_records


def rec(i):
    return {"id": f"r{i}", "text": "x" * i}


def test_parts_rotate_and_read_back_with_gzip(tmp_path):
    with ShardWriter(tmp_path, records_per_part=5, flush_every=2) as w:
        for i in range(12):
            w.add(rec(i))
    names = [p.name for p in parts(tmp_path)]
    assert names == ["part-00000.jsonl.gz", "part-00001.jsonl.gz", "part-00002.jsonl.gz"]
    # the standard gzip reader sees the members of a part as one stream
    with gzip.open(tmp_path / "part-00000.jsonl.gz", "rt") as f:
        assert [json.loads(line)["id"] for line in f] == [f"r{i}" for i in range(5)]
    assert [r["id"] for r in read_records(tmp_path)] == [f"r{i}" for i in range(12)]


def test_resume_skips_done_ids_and_continues_the_last_part(tmp_path):
    with ShardWriter(tmp_path, records_per_part=4, flush_every=1) as w:
        for i in range(6):
            w.add(rec(i))
    w2 = ShardWriter(tmp_path, records_per_part=4, flush_every=1)
    assert w2.done == {f"r{i}" for i in range(6)}
    assert w2.path.name == "part-00001.jsonl.gz"
    w2.add(rec(6))
    w2.add(rec(7))
    w2.add(rec(8))
    w2.close()
    assert [len(list(read_records(p))) for p in parts(tmp_path)] == [4, 4, 1]


def test_torn_last_member_is_truncated_on_open(tmp_path):
    with ShardWriter(tmp_path, records_per_part=100, flush_every=2) as w:
        for i in range(4):
            w.add(rec(i))
    part = parts(tmp_path)[0]
    whole = part.read_bytes()
    member = gzip.compress(b'{"id": "r4"}\n', mtime=0)
    part.write_bytes(whole + member[:len(member) // 2])       # an interrupted flush
    assert [r["id"] for r in read_records(part)] == ["r0", "r1", "r2", "r3"]
    w = ShardWriter(tmp_path, records_per_part=100, flush_every=1)
    assert part.read_bytes() == whole
    assert "r4" not in w.done


def test_copy_complete_takes_only_whole_members(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    with ShardWriter(src, records_per_part=3, flush_every=1) as w:
        for i in range(5):
            w.add(rec(i))
    last = parts(src)[-1]
    last.write_bytes(last.read_bytes() + b"\x1f\x8b\x08garbage")
    assert copy_complete(src, dst) == 5
    assert [r["id"] for r in read_records(dst)] == [f"r{i}" for i in range(5)]
    assert gzip.decompress((dst / last.name).read_bytes()).count(b"\n") == 2


def test_writer_rejects_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="records_per_part"):
        ShardWriter(tmp_path, records_per_part=0)


def test_training_reader_reads_a_corpus_folder(tmp_path):
    from flashmap_ext.train.data import read_jsonl
    with ShardWriter(tmp_path, records_per_part=2, flush_every=1) as w:
        for i in range(3):
            w.add({"id": f"r{i}", "messages": []})
    assert [r["id"] for r in read_jsonl(str(tmp_path))] == ["r0", "r1", "r2"]
    assert [r["id"] for r in read_jsonl(str(parts(tmp_path)[1]))] == ["r2"]


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x1c", "\x0b", "\x0c", "\r"])
def test_a_record_holding_a_unicode_line_separator_reads_back_whole(tmp_path, sep):
    """Answers may hold U+2028 and friends raw (json.dumps with ensure_ascii=False); only "\\n" ends a record."""
    records = [{"id": "a", "text": f"one{sep}two"}, {"id": "b", "text": "three"}]
    with ShardWriter(tmp_path, records_per_part=5, flush_every=1) as w:
        for r in records:
            w.add(r)
    assert list(read_records(tmp_path)) == records
    assert list(read_records(tmp_path / "part-00000.jsonl.gz")) == records
    resumed = ShardWriter(tmp_path, records_per_part=5, flush_every=1)
    assert resumed.done == {"a", "b"}
    resumed.close()
    assert copy_complete(tmp_path, tmp_path / "copy") == 2


def test_a_broken_record_is_named_by_file_and_number(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"id": "a"}\n{"id": "b\n')
    with pytest.raises(ValueError, match=r"c\.jsonl: record 1 is not JSON"):
        list(read_records(tmp_path / "c.jsonl"))


def test_a_file_that_is_not_gzip_or_a_folder_without_parts_is_named(tmp_path):
    (tmp_path / "fake.jsonl.gz").write_text('{"id": "a"}\n')
    with pytest.raises(ValueError, match=r"fake\.jsonl\.gz: not a gzip file"):
        list(read_records(tmp_path / "fake.jsonl.gz"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: a folder without corpus parts"):
        list(read_records(tmp_path / "empty"))
    torn = gzip.compress(b'{"id": "a"}\n')[:5]  # a gzip write cut short: no complete record, no error
    (tmp_path / "torn.jsonl.gz").write_bytes(torn)
    assert list(read_records(tmp_path / "torn.jsonl.gz")) == []
