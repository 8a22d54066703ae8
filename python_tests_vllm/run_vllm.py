"""Runs vLLM (CPU build, fp32, greedy) on the test prompts in this process and writes JSON results.

    python run_vllm.py TARGET_DIR PROMPTS_JSON OUT_JSON [SPECULATIVE_CONFIG_JSON]

Output: {"batch": all prompts in one generate call, "solo": each prompt alone, "proposals": per solo
prompt the drafter's calls as [anchor token, draft tokens]}. Proposals are recorded by wrapping the
DFlash proposer's `propose` (the engine runs in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""
from __future__ import annotations

import json
import os
import sys

MAX_TOKENS = 24


def _drafter(llm):
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner.drafter


def main(target: str, prompts_file: str, out_file: str, spec: str | None) -> None:
    from vllm import LLM, SamplingParams

    prompts = json.loads(open(prompts_file).read())
    llm = LLM(model=target, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=256,
              max_num_seqs=4, seed=0, speculative_config=json.loads(spec) if spec else None)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    calls: list = []
    if spec:
        drafter = _drafter(llm)
        propose = drafter.propose

        def recording(*args, **kwargs):
            drafts = propose(*args, **kwargs)
            calls.append([kwargs["next_token_ids"].tolist(), drafts.tolist()])
            return drafts
        drafter.propose = recording

    def run(batch):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    result = {"batch": run(prompts), "solo": [], "proposals": []}
    for p in prompts:
        calls.clear()
        result["solo"].append(run([p])[0])
        result["proposals"].append([[a[0], d[0]] for a, d in calls])
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":  # vLLM may spawn workers: keep the module importable without side effects
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(*sys.argv[1:4], sys.argv[4] if len(sys.argv) > 4 else None)
