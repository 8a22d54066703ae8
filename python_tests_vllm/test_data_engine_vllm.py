"""`flashmap data generate --engine vllm` (data/vllm_engine.py) on a tiny random target: vLLM's greedy answers,
cut at the stop ids as the refill engine cuts them, equal plain greedy decoding in fp32."""
import json
import os
import subprocess
import sys

import torch

import models
from conftest import ENV

RUNNER = """
import json, sys
from flashmap_ext.data.engine import Job
from flashmap_ext.data.vllm_engine import VllmEngine
target, prompts, stops, out = sys.argv[1], json.loads(sys.argv[2]), set(json.loads(sys.argv[3])), sys.argv[4]
engine = VllmEngine(target, "fp32", batch_size=3, max_model_len=128)
jobs = list(engine.generate([Job(i, p) for i, p in enumerate(prompts)], stop_ids=stops, max_new_tokens=12, chunk=2))
json.dump({"answers": [[j.key, j.answer, j.stopped] for j in jobs], "version": engine.version}, open(out, "w"))
"""


def greedy(model, prompt, stops, max_new):
    """Plain greedy: the whole sequence through the model at every step, no cache, no batch."""
    seq, answer = list(prompt), []
    for _ in range(max_new):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        if token in stops:
            return answer, True
        answer.append(token)
        seq.append(token)
    return answer, False


def test_vllm_engine_answers_equal_plain_greedy(tmp_path):
    model = models.tiny_target(tmp_path / "target")
    prompts = models.prompts()
    with torch.no_grad():   # stop ids: tokens the greedy answers reach, so both `stop` and `length` occur
        first = [greedy(model, p, set(), 12)[0] for p in prompts]
    stops = sorted({a[5] for a in first[:2]})
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "target"), json.dumps(prompts),
                           json.dumps(stops), str(out)], env={**os.environ, **ENV}, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert [k for k, _, _ in result["answers"]] == list(range(len(prompts)))   # every prompt, in input order
    with torch.no_grad():
        for key, answer, stopped in result["answers"]:
            assert (answer, stopped) == greedy(model, prompts[key], set(stops), 12)
    assert any(s for _, _, s in result["answers"]) and result["version"]
