"""Training samples cut or dropped by --max-length: counted, reported at the end of
`flashmap features` and in the cache's manifest.json; a dataset where every sample drops is refused.

Expected counts by hand: the byte tokenizer renders a turn as "user: <text>\\n" and the generation prompt
"assistant: ", one id per byte, and the response as its bytes + EOS."""
import json

import pytest

from flashmap_ext import cli
from flashmap_ext.target import ByteTokenizer
from flashmap_ext.train.data import DataReport, load_samples

MAX = 64


def conversation(id, prompt_len, response_len):
    """A conversation whose rendered prompt is `prompt_len` ids and response `response_len` ids (EOS in)."""
    text = "x" * (prompt_len - len("user: \nassistant: "))
    return {"id": id, "messages": [{"role": "user", "content": text},
                                   {"role": "assistant", "content": "y" * (response_len - 1)}]}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [conversation("fits", 30, 20),        # 50 ids: kept whole
        conversation("cut", 40, 40),         # 80 ids: cut to 64, 24 supervised left
        conversation("long", 70, 10),        # prompt alone beyond 64: no supervised id left, dropped
        conversation("edge", MAX, 5)]        # prompt exactly 64: dropped too


def test_load_samples_counts_truncated_and_dropped(tmp_path):
    report = DataReport()
    samples = list(load_samples(str(write(tmp_path / "d.jsonl", ROWS)), ByteTokenizer(), max_length=MAX,
                                report=report))
    assert [s.id for s in samples] == ["fits/0", "cut/0"]
    assert [len(s.input_ids) for s in samples] == [50, MAX] and sum(samples[1].loss_mask) == MAX - 40
    assert report.kept == 2 and report.truncated == ["cut/0"] and report.dropped == ["long/0", "edge/0"]
    assert "2 of 4 samples dropped" in report.summary() and "1 truncated" in report.summary()


def test_every_sample_dropped_is_refused(tmp_path):
    path = write(tmp_path / "d.jsonl", ROWS[2:])
    with pytest.raises(ValueError, match=f"every sample .*dropped.*max.length {MAX}"):
        list(load_samples(str(path), ByteTokenizer(), max_length=MAX))


@pytest.mark.parametrize("line, needle", [('[{"messages": []}]', "expected one JSON object per line, got a list"),
                                          ('{"messages": "hi"}', "has no 'messages' list"),
                                          ('{"messages": ["hi"]}', "has no 'messages' list")])
def test_records_of_another_shape_are_named(tmp_path, line, needle):
    (tmp_path / "d.jsonl").write_text(line + "\n")
    with pytest.raises(ValueError, match=needle):
        list(load_samples(str(tmp_path / "d.jsonl"), ByteTokenizer()))


def test_features_cli_reports_and_records_them(tmp_path, capsys):
    data = write(tmp_path / "d.jsonl", ROWS)
    args = ["features", "--target", "tiny-random", "--data", str(data), "--layers", "1", "--dtype", "fp32",
            "--target-dtype", "fp32", "--device", "cpu", "--max-length", str(MAX), "--no-progress"]
    assert cli.main(args + ["--out", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    assert "2 of 4 samples dropped" in err and "long/0" in err and "1 truncated" in err, err
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert manifest["samples"] == {"kept": 2, "truncated": 1, "dropped": 2, "truncated_ids": ["cut/0"],
                                   "dropped_ids": ["long/0", "edge/0"]}
    assert cli.main(args[:4] + [str(write(tmp_path / "e.jsonl", ROWS[2:]))] + args[5:]
                    + ["--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every sample" in err and "Traceback" not in err, err
    assert not (tmp_path / "g").exists()  # refused before the cache folder was made
    assert cli.main(args[:4] + [str(write(tmp_path / "n.jsonl", [{"id": "x", "text": "no turns"}]))] + args[5:]
                    + ["--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no 'messages'" in err and not (tmp_path / "n").exists(), err


def test_data_generate_reports_prompts_skipped_as_too_long(tmp_path, capsys):
    """`flashmap data generate --max-prompt-tokens N`: prompts longer than N (rendered: "user: <text>\\n
    assistant: ") are skipped, counted on stderr and in the final progress line; all skipped is refused."""
    prompts = [{"id": i, "messages": [{"role": "user", "content": "x" * n}]} for i, n in
               (("short", 5), ("long", 40), ("longer", 60))]
    args = ["data", "generate", "--target", "tiny-random", "--max-prompt-tokens", "30", "--max-new-tokens", "3",
            "--batch-size", "2", "--dtype", "fp32", "--no-progress"]
    assert cli.main(args + ["--prompts", str(write(tmp_path / "p.jsonl", prompts)), "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    done = json.loads([line for line in err.splitlines() if '"done"' in line][-1])
    assert done["records"] == 1 and done["skipped_long_prompts"] == 2, err
    assert "2 of 3 prompts skipped" in err and "long, longer" in err, err
    assert cli.main(args + ["--prompts", str(write(tmp_path / "q.jsonl", prompts[1:])), "--out",
                            str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "every prompt" in err and "--max-prompt-tokens 30" in err and "Traceback" not in err, err
