"""Greedy self-answering with vLLM's offline engine (`flashmap data generate --engine vllm`).

The prompts are the same token ids the refill engine (`data.engine`) prefills (`train.data.prompt_ids`: the
target's chat template, thinking off), handed to `LLM.generate` as token prompts, so both engines answer the
same inputs and the caller decodes both answers with the same tokenizer into the same record. Greedy
(temperature 0), stopping at the same end-of-turn ids; the stop token is not part of the answer and
`stopped` says whether one came, as in `data.engine.Job`.

vLLM is an optional dependency (its CPU build lives in its own virtual environment, `make test-vllm`): this
module imports it only when an engine is built, and `VllmMissing` names the fix where it does not import.
`generate` hands vLLM `chunk` prompts per call (its scheduler keeps up to `batch_size` sequences decoding,
refilling as they end) and yields each chunk's answers when the call returns, so an interrupted run loses at
most one chunk, which the next run answers again.
"""
from __future__ import annotations

import time
from typing import Iterable, Iterator

from flashmap_ext.data.engine import EngineStats, Job

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class VllmMissing(ImportError):
    """vLLM does not import in this Python."""


def vllm_version() -> str:
    """The installed vLLM's version; VllmMissing naming the fix when it does not import."""
    try:
        import vllm
    except ImportError as e:
        raise VllmMissing(f"--engine vllm: vLLM does not import here ({e}); run with the Python of a venv that "
                          "has it, e.g. `make .venv-vllm/.deps-installed` then .venv-vllm/bin/python -m "
                          "flashmap_ext.cli data generate --engine vllm ...") from None
    return vllm.__version__


class VllmEngine:
    """vLLM's offline `LLM` over a local HF model folder, answering token prompts greedily.

    Args: target_dir: the HF folder (config.json, weights, tokenizer); dtype: 'fp32'|'bf16'|'fp16';
    batch_size: the most sequences decoded together (vLLM's max_num_seqs); max_model_len: prompt + answer
    tokens per sequence (a longer request is refused by vLLM). `start_s` is the time the engine took to start.
    """

    def __init__(self, target_dir: str, dtype: str, batch_size: int, max_model_len: int = 1024):
        if dtype not in DTYPES:
            raise ValueError(f"--dtype: vLLM engine takes one of {sorted(DTYPES)}, got {dtype!r}")
        self.version = vllm_version()
        from vllm import LLM
        start = time.perf_counter()
        self.llm = LLM(model=str(target_dir), dtype=DTYPES[dtype], max_model_len=max_model_len,
                       max_num_seqs=batch_size, seed=0, skip_tokenizer_init=True)
        self.start_s = time.perf_counter() - start
        self.max_model_len = max_model_len

    def generate(self, jobs: Iterable[Job], *, stop_ids: set[int], max_new_tokens: int, chunk: int = 768,
                 stats: EngineStats | None = None) -> Iterator[Job]:
        """Greedy answers of `jobs` (at most `max_new_tokens` tokens each, the stop token excluded), yielded
        chunk by chunk in input order. Raises ValueError where a prompt plus max_new_tokens exceeds
        max_model_len, naming the prompt."""
        from vllm import SamplingParams
        if max_new_tokens < 1 or chunk < 1:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) and chunk ({chunk}) must be >= 1")
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=sorted(stop_ids),
                                detokenize=False, skip_special_tokens=False)
        stats = stats if stats is not None else EngineStats()
        batch: list[Job] = []
        for job in jobs:
            if len(job.prompt) + max_new_tokens > self.max_model_len:
                raise ValueError(f"prompt {job.key.get('id') if isinstance(job.key, dict) else job.key}: "
                                 f"{len(job.prompt)} tokens + --max-new-tokens {max_new_tokens} exceed the vLLM "
                                 f"engine's max_model_len {self.max_model_len}")
            batch.append(job)
            if len(batch) == chunk:
                yield from self._answer(batch, params, stop_ids, stats)
                batch = []
        if batch:
            yield from self._answer(batch, params, stop_ids, stats)

    def _answer(self, batch: list[Job], params, stop_ids: set[int], stats: EngineStats) -> list[Job]:
        outs = self.llm.generate([{"prompt_token_ids": j.prompt} for j in batch], params, use_tqdm=False)
        for job, out in zip(batch, outs):
            fill_answer(job, list(out.outputs[0].token_ids), stop_ids)
            stats.prompt_tokens += len(job.prompt)
            stats.answer_tokens += len(job.answer)
        return batch


def fill_answer(job: Job, tokens: list[int], stop_ids: set[int]) -> Job:
    """Sets job.answer / job.stopped from an engine's output tokens: cut at the first stop id (excluded)."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            job.answer, job.stopped = tokens[:i], True
            return job
    job.answer, job.stopped = tokens, False
    return job
