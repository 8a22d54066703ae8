"""The README's code runs: its Python snippet and its command-line block, on a tiny random target.

The real target and the committed checkpoints are swapped for tiny ones by plain text substitution
(`CLI_SWAPS`, and the snippet's target and drafter paths); each swapped string must occur in the README, so
an edit there that this test no longer understands fails here instead of being skipped. `generate` and
`--help` lines run; `bench`, `demo`, `data`, `eval` and `convert` lines (they need the downloaded prompt
sets, corpora and minutes of CPU) are parsed by the real CLI parser.
"""
import ast
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
REAL_TARGET = "qwen2.5-coder-0.5b"
CLI_SWAPS = {f"--target {REAL_TARGET}": "--target tiny-random",
             "checkpoints/flashmap-qwen2.5-coder-0.5b": "random",
             "checkpoints/eagle3-qwen2.5-coder-0.5b": "random-eagle3"}
PARSE_ONLY = ("bench", "demo", "data", "eval", "convert")  # downloads, corpora or minutes of CPU; convert:
# the committed weights (test_convert.py runs it on tiny checkpoints)


def fenced_blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def swapped(text: str, swaps: dict) -> str:
    for old, new in swaps.items():
        assert old in text, f"README no longer contains {old!r}: update test_readme.py's swaps"
        text = text.replace(old, new)
    return text


def byte_level_tokenizer_dir(path: Path, vocab_size: int) -> None:
    """A Hugging Face fast tokenizer over the 256 byte symbols plus an end-of-text token (id 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    assert len(fast) == vocab_size
    fast.save_pretrained(path)


def test_python_snippet_runs_and_prints(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "cache"))  # the cost table of AutoDrafter goes there
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.target import BYTE_EOS, tiny_random_model
    model = tiny_random_model()
    model.save_pretrained(tmp_path / "target")
    byte_level_tokenizer_dir(tmp_path / "target", BYTE_EOS + 1)
    torch.manual_seed(0)
    FlashMapDrafter.for_target(model, n_layers=1, width=64, heads=2, block_size=8).save_pretrained(
        tmp_path / "drafter")
    (snippet,) = fenced_blocks("python", section("Python API"))  # "Serving with vLLM": python_tests_vllm
    code = swapped(snippet, {"qwen05_dir()": repr(str(tmp_path / "target")),
                             '"checkpoints/flashmap-qwen2.5-coder-0.5b"': repr(str(tmp_path / "drafter"))})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue()
    for promised in ("verify:", "sample:", "γ ", "tokens/s", "drafted block:", "auto:", "batch: [32, 8]"):
        assert promised in printed, printed
    block = re.search(r"drafted block: \[\[([\d, ]+)\]\]", printed)
    assert block and len(block.group(1).split(",")) == 8


def cli_lines() -> list[str]:
    (block,) = re.findall(r"^```\n(flashmap .*?)^```$", section("Command line"), flags=re.S | re.M)
    commands = [cmd.split("#")[0].strip() for line in block.splitlines() for cmd in line.split(";")]
    return [c for c in commands if c]


def test_cli_block_uses_no_placeholders():
    assert len(cli_lines()) >= 6
    for cmd in cli_lines():
        assert not re.search(r"\.\.\.|\b[A-Z][A-Z0-9_]{2,}\b|\{", cmd), f"placeholder in README command: {cmd}"


@pytest.mark.parametrize("cmd", cli_lines())
def test_cli_line_runs(cmd, capsys, tmp_path, monkeypatch):
    from flashmap_ext import cli
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))  # --auto caches its cost table there
    argv = shlex.split(swapped(cmd, {k: v for k, v in CLI_SWAPS.items() if k in cmd}))[1:]
    if "--help" in argv:
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0 and "usage: flashmap" in capsys.readouterr().out
        return
    if argv[0] in PARSE_ONLY:
        args = cli.build_parser().parse_args(argv)
        assert args.command == argv[0]
        return
    assert REAL_TARGET not in " ".join(argv)
    assert cli.main(argv + ["--max-new-tokens", "12"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "tokens in" in captured.err  # the streamed text, then the stats line


def test_readme_code_imports_no_old_module_path():
    """The README's code (every fenced block) names modules by their current paths, never an old path kept
    as an alias (flashmap_ext/_aliases.py): the "Serving with vLLM" block once imported `bench.assets`."""
    from flashmap_ext._aliases import ALIASES
    lines, inside = [], False
    for line in README.splitlines():  # every fenced block, whatever its language
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    code = "\n".join(lines)
    named = set(re.findall(r"\bflashmap_ext\.([\w.]+)", code))
    assert "integrations.vllm" in named and "assets.models" in named  # both blocks are seen
    assert not {n for n in named for old in ALIASES if n == old or n.startswith(old + ".")}, named


def old_module_imports(file: Path, aliases) -> list[str]:
    """'file:line: module' for each import in `file` of an old module path (a key of `aliases`)."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [f"{file.name}:{node.lineno}: {n}" for n in names
                  if n.startswith("flashmap_ext.") and n.removeprefix("flashmap_ext.") in aliases]
    return found


def test_project_code_imports_no_old_module_path(tmp_path):
    """The package, scripts, benches and tests import current module paths; the aliases of
    flashmap_ext/_aliases.py are for users' code only (scripts/long_context.py imported `bench.assets`)."""
    from flashmap_ext._aliases import ALIASES
    (tmp_path / "x.py").write_text("import flashmap_ext.flow\nfrom flashmap_ext.bench import assets\n"
                                   "from flashmap_ext.assets import models\n")
    assert old_module_imports(tmp_path / "x.py", ALIASES) == ["x.py:1: flashmap_ext.flow",
                                                              "x.py:2: flashmap_ext.bench.assets"]
    files = [f for folder in ("flashmap_ext", "scripts", "benches", "python_tests", "python_tests_vllm")
             for f in sorted((ROOT / folder).rglob("*.py")) if f.name != "_aliases.py"]
    assert not [hit for f in files for hit in old_module_imports(f, ALIASES)]


def test_prose_names_no_old_module_path_and_readme_paths_exist():
    """Docstrings, help texts and docs cite current module paths: `flashmap data generate --help` said its
    corpus is written by `data.store` (an alias of train.store), heldout.py named `drafters.base`. And every
    tracked-looking path the README cites exists: it pointed at python_tests/test_readme.py (moved to decode/)."""
    from flashmap_ext._aliases import ALIASES
    dotted = [old for old in ALIASES if "." in old]  # `flow`, `reference` are also plain words
    files = [f for folder in ("flashmap_ext", "scripts", "benches", "docs") for f in sorted((ROOT / folder).rglob("*"))
             if f.suffix in (".py", ".md", ".sh") and f.name != "_aliases.py"]
    files += [ROOT / p for p in ("BENCHMARKS.md", "checkpoints/README.md", "data/README.md")]
    hits = [f"{f.relative_to(ROOT)}:{i}: {name}" for f in files
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            for name in re.findall(r"`(?:flashmap_ext\.)?([\w.]+)`", line)
            if any(name == old or name.startswith(old + ".") for old in dotted)]
    assert not hits
    cited = set(re.findall(r"`((?:python_tests|python_tests_vllm|flashmap_ext|scripts|benches|csrc|docs)/[\w./-]+)`",
                           README))
    assert len(cited) > 5 and not [p for p in sorted(cited) if not (ROOT / p).exists()]


@pytest.mark.parametrize("kind, steps", [("flashmap", 1), ("flashmap", 2), ("dflash", None), ("eagle3", None)])
def test_own_decoder_loop_runs_as_written_and_equals_greedy(kind, steps):
    """The "Use it in your own decoder" block, exec'd as written, then called on a tiny random Qwen3 for one
    prompt and a ragged batch of two: each row equals plain greedy decoding (full recompute per token)."""
    from conftest import tiny_qwen3
    from drafter_doubles import greedy_continuation, random_flashmap
    (block,) = fenced_blocks("python", section("Use it in your own decoder"))
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    model = tiny_qwen3()
    if kind == "flashmap":
        drafter = random_flashmap(model, 6, (0, 2)).eval()
        drafter.config.draft_steps = steps
    elif kind == "eagle3":
        from flashmap_ext.drafters.eagle3 import Eagle3Drafter
        drafter = Eagle3Drafter.for_target(model, num_draft_tokens=4, dtype=torch.float32).eval()
    else:
        drafter = fm_dflash(model)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 111, (n,), generator=g).tolist() for n in (7, 13)]
    for batch in ([prompts[1]], prompts):
        out = scope["speculative_greedy"](model, drafter, batch, 20)
        assert [len(o) for o in out] == [20] * len(batch)
        for prompt, row in zip(batch, out):
            assert row == greedy_continuation(model, prompt, 20).tolist()


def fm_dflash(model):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    torch.manual_seed(1)
    return DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=5,
                                    target_layer_ids=[0, 2], dtype=torch.float32).eval()
