"""Training data: chat conversations rendered exactly as the target sees them at inference (DESIGN.md §8).

A conversation is one jsonl line `{"id"?: str|int, "messages": [{"role", "content", "reasoning_content"?}],
"enable_thinking"?: bool}`. Every assistant turn becomes

    prompt tokens  = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, enable_thinking=...)
    response tokens = the tokens the target would emit for that turn, up to and including its end-of-turn token

so the drafter is trained on exactly the token stream of a decode (a template that renders history
differently from the generation prompt, such as Qwen3 with thinking off, never leaks into training).
Consecutive turns share one sequence when the next prompt extends the previous sequence token for token;
otherwise a new sequence starts. `loss_mask` is 1 on response tokens only.
"""
from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from flashmap_ext.train.store import read_records


@dataclass
class Sample:
    """One training sequence. input_ids: [T] token ids; loss_mask: [T] 1 on assistant (response) tokens."""
    id: str
    input_ids: list[int]
    loss_mask: list[int]


@dataclass
class DataReport:
    """What `max_length` did to a dataset: sample ids kept, cut short (kept, some supervised tokens lost)
    and dropped (no supervised token left)."""
    kept: int = 0
    truncated: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def summary(self, max_length: Optional[int] = None) -> str:
        """One line, e.g. "2 of 4 samples dropped (no response token within max_length 64: a, b), 1
        truncated"."""
        limit = f" within max_length {max_length}" if max_length else ""
        ids = ", ".join(self.dropped[:8]) + (", ..." if len(self.dropped) > 8 else "")
        dropped = f" ({'no response token' + limit}: {ids})" if self.dropped else ""
        return (f"{len(self.dropped)} of {self.kept + len(self.dropped)} samples dropped{dropped}, "
                f"{len(self.truncated)} truncated to max_length")

    def as_dict(self) -> dict:
        return {"kept": self.kept, "truncated": len(self.truncated), "dropped": len(self.dropped),
                "truncated_ids": list(self.truncated), "dropped_ids": list(self.dropped)}


def read_jsonl(path: str) -> Iterator[dict]:
    """Streams the records of a jsonl file; a missing `id` becomes the 0-based line number (as a string).

    A torn last line (a write interrupted mid-line: no trailing newline) is skipped; any other malformed
    line raises ValueError naming the file and line. Memory use does not grow with the file. A corpus
    folder or .jsonl.gz part of `flashmap data generate` (train.store) is read through `read_records`.
    """
    if path.endswith(".gz") or os.path.isdir(path):
        for n, record in enumerate(read_records(path)):
            if not isinstance(record, dict):
                raise ValueError(f"{path}: record {n} is a {type(record).__name__}, not a JSON object")
            record["id"] = str(record.get("id", n))
            yield record
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):
                    return
                raise ValueError(f"{path}:{n + 1}: not valid JSON ({err})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{n + 1}: expected one JSON object per line, got a {type(record).__name__}")
            record["id"] = str(record.get("id", n))
            yield record


def _render(tokenizer, messages, generation_prompt: bool, enable_thinking: bool) -> str:
    """Chat-template text. `enable_thinking` reaches templates through HF's template kwargs; a tokenizer
    whose apply_chat_template takes no extra kwargs renders without."""
    kwargs = {}
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    if "enable_thinking" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs["enable_thinking"] = enable_thinking
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                         **kwargs)


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` without BOS/EOS: what apply_chat_template(tokenize=True) does with its text."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer, messages: Sequence[dict], enable_thinking: bool = False) -> list[int]:
    """The inference prompt: the ids of apply_chat_template(messages, add_generation_prompt=True)."""
    return encode(tokenizer, _render(tokenizer, messages, True, enable_thinking))


def stop_token_ids(tokenizer) -> set[int]:
    """End-of-turn ids: the tokenizer's eos plus `<|im_end|>` / `<|eot_id|>` / `<|end|>` when in the vocab."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = {eos} if eos is not None else set()
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids |= {vocab[t] for t in ("<|im_end|>", "<|eot_id|>", "<|end|>") if t in vocab}
    return ids


def response_ids(tokenizer, messages: Sequence[dict], i: int, enable_thinking: bool = False) -> list[int]:
    """Tokens the target emits for assistant turn `messages[i]`, ending with its end-of-turn token.

    The response text is the template's rendering of the turn minus the part it shares with the generation
    prompt (e.g. `<|im_start|>assistant\\n`); whatever the template puts after the end-of-turn token (a
    newline) is dropped, since decoding stops there. Raises ValueError if the template renders the history
    of turn i differently with and without it.
    """
    base = _render(tokenizer, messages[:i], False, enable_thinking)
    head = _render(tokenizer, messages[:i], True, enable_thinking)[len(base):]
    full = _render(tokenizer, messages[:i + 1], False, enable_thinking)
    if not full.startswith(base):
        raise ValueError(f"chat template renders the history before turn {i} differently once it is appended")
    block = full[len(base):]
    n = 0
    while n < min(len(block), len(head)) and block[n] == head[n]:
        n += 1
    ids = encode(tokenizer, block[n:])
    stops = stop_token_ids(tokenizer)
    ends = [j for j, t in enumerate(ids) if t in stops]
    return ids[:ends[-1] + 1] if ends else ids


def _without_reasoning(message: dict) -> dict:
    """Thinking off: the turn as the target would produce it, without reasoning_content or a <think> block."""
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    content = out.get("content")
    if isinstance(content, str) and "</think>" in content:
        out["content"] = content.split("</think>", 1)[1].lstrip("\n")
    return out


def render_conversation(tokenizer, messages: Sequence[dict], enable_thinking: bool = False,
                        max_length: int | None = None, id: str = "0",
                        report: DataReport | None = None) -> list[Sample]:
    """Renders one conversation into training sequences (see module docstring).

    Returns one Sample per run of turns whose prompts extend each other token for token, truncated to
    `max_length` tokens. Samples with no supervised token left are dropped; `report` counts both.
    Raises ValueError when the messages list is malformed (no assistant turn after a user/system turn,
    unknown role).
    """
    if not enable_thinking:
        messages = [_without_reasoning(m) if m.get("role") == "assistant" else m for m in messages]
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
    if not turns:
        raise ValueError(f"conversation {id!r}: needs a user turn followed by an assistant turn")
    samples, ids, mask = [], [], []
    for i in turns:
        prompt = prompt_ids(tokenizer, messages[:i], enable_thinking)
        if prompt[:len(ids)] != ids:  # this turn's prompt does not extend the current sequence: start anew
            samples.append(Sample(f"{id}/{len(samples)}", ids, mask))
            ids, mask = [], []
        mask += [0] * (len(prompt) - len(ids))
        ids = prompt + (resp := response_ids(tokenizer, messages, i, enable_thinking))
        mask += [1] * len(resp)
    samples.append(Sample(f"{id}/{len(samples)}", ids, mask))
    out, report = [], DataReport() if report is None else report
    for s in samples:
        cut = max_length is not None and len(s.input_ids) > max_length
        if cut:
            s.input_ids, s.loss_mask = s.input_ids[:max_length], s.loss_mask[:max_length]
        if not any(s.loss_mask):
            report.dropped.append(s.id)
            continue
        report.truncated.extend([s.id] if cut else [])
        report.kept += 1
        out.append(s)
    return out


def load_samples(path: str, tokenizer, enable_thinking: bool = False, max_length: int | None = None,
                 report: DataReport | None = None) -> Iterator[Sample]:
    """Streams the Samples of a conversations jsonl file. A record's own `enable_thinking` wins.
    `report` counts the samples kept, truncated and dropped by `max_length`; ValueError at the end of
    the file when there was no sample or every sample was dropped (nothing to train on)."""
    report = DataReport() if report is None else report
    for record in read_jsonl(path):
        messages = record.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError(f"{path}: record {record['id']!r} has no 'messages' list of {{role, content}} objects")
        yield from render_conversation(tokenizer, record["messages"], record.get("enable_thinking", enable_thinking),
                                       max_length, record["id"], report)
    if report.dropped and not report.kept:
        raise ValueError(f"{path}: every sample was dropped: {report.summary(max_length)}; raise --max-length")
    if not report.kept:
        raise ValueError(f"{path}: no conversation with an assistant turn in it (nothing to train on)")
