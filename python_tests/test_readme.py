"""The README's code runs: its Python snippet and its command-line block, on a tiny random target.

The real target and the committed checkpoints are swapped for tiny ones by plain text substitution
(`CLI_SWAPS`, and the snippet's target and drafter paths); each swapped string must occur in the README, so
an edit there that this test no longer understands fails here instead of being skipped. `generate` and
`--help` lines run; `bench`, `demo`, `data`, `eval` and `convert` lines (they need the downloaded prompt
sets, corpora and minutes of CPU) are parsed by the real CLI parser.
"""
import contextlib
import io
import re
import shlex
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
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
    FlashMapDrafter.for_target(model, n_layers=1, width=64, heads=2, block_size=8).to(torch.bfloat16).save_pretrained(
        tmp_path / "drafter")  # bf16 as the committed checkpoints, on an fp32 target
    (snippet,) = fenced_blocks("python", section("Python API"))  # "Serving with vLLM": python_tests_vllm
    code = swapped(snippet, {"qwen05_dir()": repr(str(tmp_path / "target")),
                             '"checkpoints/flashmap-qwen2.5-coder-0.5b"': repr(str(tmp_path / "drafter"))})
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*drafter's weights are")  # the snippet matches the dtypes
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue()
    for promised in ("verify:", "sample:", "γ ", "tokens/s", "drafted block:", "auto:", "batch: [32, 8]"):
        assert promised in printed, printed
    block = re.search(r"drafted block: \[\[([\d, ]+)\]\]", printed)
    assert block and len(block.group(1).split(",")) == 8


def test_verify_comment_says_check_is_the_default():
    """The snippet said status is 'raised as ValueError when check=True', which reads as opt-in."""
    import inspect

    from flashmap_ext import ops
    (snippet,) = fenced_blocks("python", section("Python API"))
    assert inspect.signature(ops.verify).parameters["check"].default is True
    assert "check=True is the default" in snippet and "when check=True" not in snippet


def test_own_decoder_says_what_model_is_and_that_way_runs():
    """The section never said what `model` is (an HF causal LM, not the `Target` fm.load_target returns);
    the way it names, `fm.load_target(path)[0].model` with a drafter `from_pretrained(ckpt, model)`, runs."""
    import tempfile

    import flashmap_ext as fm
    from support.drafter_doubles import greedy_continuation, random_flashmap
    from flashmap_ext.target import TINY
    prose = section("Use it in your own decoder").split("```python")[0]
    for said in ("`model` is the target as a plain Hugging Face", "`AutoModelForCausalLM`", "`target.model`",
                 "`target, tokenizer = fm.load_target(path)`", "`fm.FlashMapDrafter.from_pretrained(ckpt, model)`"):
        assert said in prose, said
    (block,) = fenced_blocks("python", section("Use it in your own decoder"))
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    target, _ = fm.load_target(TINY, "fp32", "cpu")
    model = target.model
    with tempfile.TemporaryDirectory() as ckpt:
        random_flashmap(model, 4, (0, 1)).save_pretrained(ckpt)
        drafter = fm.FlashMapDrafter.from_pretrained(ckpt, model).eval()
    prompt = list(b"def f(x):")
    (row,) = scope["speculative_greedy"](model, drafter, [prompt], 12)
    assert row == greedy_continuation(model, prompt, 12).tolist()


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


def readme_code() -> str:
    """Every fenced block of the README, whatever its language, joined."""
    lines, inside = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return "\n".join(lines)


def test_readme_code_names_modules_that_exist():
    """Every `flashmap_ext.<module>` the README's code names is a module of this checkout (the "Serving with
    vLLM" block once imported `bench.assets`, a path kept alive only by an import hook); pre-restructure paths
    are gone: no hook maps them any more (issue 28)."""
    import importlib
    named = set(re.findall(r"\bflashmap_ext\.([a-z_][\w.]*)", readme_code()))
    assert {"integrations.vllm", "assets.models", "draft_shapes.auto", "target.ragged"} <= named  # all blocks seen
    assert not [n for n in sorted(named) if not _is_module(f"flashmap_ext.{n}")]
    for old in ("flashmap_ext.flow", "flashmap_ext.drafters.flashmap_fused", "flashmap_ext.bench.assets",
                "flashmap_ext.drafters.lookup", "flashmap_ext.cost_model"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def _is_module(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is not a package
        return False


def public_names_paragraph() -> list[str]:
    """The plain names (no dots, no calls) in the README's "public names" paragraph."""
    match = re.search(r"The package's public names \(`flashmap_ext.__all__`, exactly these\):(.*?)Everything else",
                      README, flags=re.S)
    assert match, "README lost its public-names paragraph"
    return [n for n in re.findall(r"`([^`]+)`", match.group(1)) if re.fullmatch(r"[A-Za-z_]\w*", n)]


def test_public_names_are_exactly_the_readmes():
    """`flashmap_ext.__all__` is the README's list, each name resolves, and every `fm.<name>` the README's code
    uses is on it (issue 28: the public list is the README's)."""
    import flashmap_ext as fm
    listed = public_names_paragraph()
    assert len(listed) == len(set(listed)) and sorted(listed) == sorted(fm.__all__)
    assert all(hasattr(fm, n) for n in fm.__all__)
    used = set(re.findall(r"\bfm\.([A-Za-z_]\w*)", readme_code()))
    assert {"verify", "draft_block", "generate"} <= used and used <= set(fm.__all__)


def test_readme_paths_exist():
    """Every tracked-looking path the README cites exists: it pointed at python_tests/test_readme.py (moved to
    decode/)."""
    cited = set(re.findall(r"`((?:python_tests|python_tests_vllm|flashmap_ext|scripts|benches|csrc|docs)/[\w./-]+)`",
                           README))
    assert len(cited) > 5 and not [p for p in sorted(cited) if not (ROOT / p).exists()]


@pytest.mark.parametrize("kind, steps", [("flashmap", 1), ("flashmap", 2), ("dflash", None), ("eagle3", None)])
def test_own_decoder_loop_runs_as_written_and_equals_greedy(kind, steps):
    """The "Use it in your own decoder" block, exec'd as written, then called on a tiny random Qwen3 for one
    prompt and a ragged batch of two: each row equals plain greedy decoding (full recompute per token)."""
    from conftest import tiny_qwen3
    from support.drafter_doubles import greedy_continuation, random_flashmap
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
        with warnings.catch_warnings():  # the block passes the cache by the name this transformers takes
            warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
            out = scope["speculative_greedy"](model, drafter, batch, 20)
        assert [len(o) for o in out] == [20] * len(batch)
        for prompt, row in zip(batch, out):
            assert row == greedy_continuation(model, prompt, 20).tolist()


def fm_dflash(model):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    torch.manual_seed(1)
    return DFlashDrafter.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=5,
                                    target_layer_ids=[0, 2], dtype=torch.float32).eval()
