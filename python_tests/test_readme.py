"""The README's code runs, and its sections are there: checks of what it does, never of its wording.

- Sections: the headings, in order, matched case-insensitively by keyword (`SECTIONS`), so renames survive.
- Python: the blocks before "Serving" (the quickstart and the API block that continues it) run as one script
  on a tiny random target; the real target's name and every `checkpoints/NAME` become tiny random stand-ins of
  the same kind, and nothing of the real ones may be left. The own-decoder loop (in the README or the page it
  links) runs as written and equals plain greedy decoding. The Serving blocks: python_tests_vllm.
- Command line: `generate` and `--help` lines run on the tiny target; `bench`, `demo`, `data`, `eval` and
  `convert` lines (prompt sets, corpora, minutes of CPU) are parsed by the real CLI parser.
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
# (what the section is, a regex its heading matches), in the README's order
SECTIONS = [("install", r"install"), ("the two commands", r"\btwo\b|\bcommands\b|\btry\b"),
            ("quickstart", r"quick\s*-?start"), ("results", r"result"), ("Python API", r"python|\bapi\b"),
            ("own decoder", r"decoder"), ("CLI", r"\bcli\b|command[ -]line"), ("serving", r"serv|vllm"),
            ("checkpoint compatibility", r"checkpoint|compatib"), ("layout", r"layout|\bfiles\b"),
            ("status", r"status")]
PARSE_ONLY = ("bench", "demo", "data", "eval", "convert")  # downloads, corpora or minutes of CPU; convert:
# the committed weights (test_convert.py runs it on tiny checkpoints)


def headings(text: str = README) -> list[tuple[str, int]]:
    """(title, offset) of every `##`-level heading outside fenced code."""
    out, inside, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            inside = not inside
        elif not inside and re.match(r"##\s", line):
            out.append((line[2:].strip(), offset))
        offset += len(line)
    return out


def section(pattern: str, text: str = README) -> str:
    """The body of the first heading matching `pattern` (case-insensitive), up to the next heading."""
    found = headings(text)
    for i, (title, start) in enumerate(found):
        if re.search(pattern, title, flags=re.I):
            end = found[i + 1][1] if i + 1 < len(found) else len(text)
            return text[start:end].split("\n", 1)[1]
    raise AssertionError(f"README has no section matching {pattern!r} (headings: {[t for t, _ in found]})")


def fenced_blocks(lang: str, text: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def test_sections_are_there_in_order():
    titles = [t for t, _ in headings()]
    intro = README.split("\n## ", 1)[0]
    assert [line for line in intro.splitlines()[1:] if line.strip()], "README starts with no 'what it is' text"
    at = 0
    for what, pattern in SECTIONS:
        hit = next((i for i in range(at, len(titles)) if re.search(pattern, titles[i], flags=re.I)), None)
        assert hit is not None, f"no '{what}' section after {titles[at - 1] if at else 'the start'!r}: {titles}"
        at = hit + 1


def byte_level_tokenizer_dir(path: Path, vocab_size: int) -> None:
    """A Hugging Face fast tokenizer over the 256 byte symbols plus an end-of-text token (id 256), with a
    plain chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    assert len(fast) == vocab_size
    fast.save_pretrained(path)


def tiny_drafter(name: str, model):
    """A tiny random drafter of the kind the checkpoint `name` holds, in bf16 as the committed ones."""
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    torch.manual_seed(0)
    if "eagle3" in name:
        return Eagle3Drafter.for_target(model, num_draft_tokens=4, dtype=torch.bfloat16)
    if "dflash" in name:
        return DFlashDrafter.for_target(model, mask_token_id=model.config.vocab_size - 1, num_hidden_layers=1,
                                        block_size=5, target_layer_ids=[0, 1], dtype=torch.bfloat16)
    return FlashMapDrafter.for_target(model, n_layers=1, width=64, heads=2, block_size=8).to(torch.bfloat16)


def tiny_stand_ins(code: str, tmp_path: Path) -> str:
    """`code` with the real target's name and every `checkpoints/NAME` replaced by tiny random stand-ins."""
    from flashmap_ext.target import BYTE_EOS, tiny_random_model
    model = tiny_random_model()
    model.save_pretrained(tmp_path / "target")
    byte_level_tokenizer_dir(tmp_path / "target", BYTE_EOS + 1)
    for i, name in enumerate(sorted(set(re.findall(r"checkpoints/([\w.-]+)", code)))):
        tiny_drafter(name, model).save_pretrained(tmp_path / f"drafter-{i}")
        code = code.replace(f"checkpoints/{name}", str(tmp_path / f"drafter-{i}"))
    code = re.sub(rf"""(["']){re.escape(REAL_TARGET)}\1""", repr(str(tmp_path / "target")), code)
    assert REAL_TARGET not in code and "qwen05_dir" not in code, "the README's code names the real target in " \
        "a form this test does not swap: update tiny_stand_ins"
    return code


def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "cache"))  # --auto's cost table goes there
    serving = next(start for title, start in headings() if re.search(r"serv|vllm", title, flags=re.I))
    blocks = fenced_blocks("python", README[:serving].replace(section("decoder"), ""))
    assert blocks, "README has no Python block before its serving section"
    code = tiny_stand_ins("\n".join(blocks), tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip(), "the README's Python blocks print nothing"


def own_decoder_block() -> tuple[str, str]:
    """(the own-decoder loop's Python block, where it was found): in the README's section, or in the first
    local page that section links."""
    body = section("decoder")
    blocks = fenced_blocks("python", body)
    if not blocks:
        for link in re.findall(r"\]\(([\w./-]+\.md)\)", body):
            blocks = fenced_blocks("python", (ROOT / link).read_text())
            if blocks:
                return blocks[0], link
    assert blocks, "the own-decoder section has no Python block and links no page with one"
    return blocks[0], "README.md"


@pytest.mark.parametrize("kind, steps", [("flashmap", 1), ("flashmap", 2), ("dflash", None), ("eagle3", None)])
def test_own_decoder_loop_runs_as_written_and_equals_greedy(kind, steps):
    """The own-decoder block, exec'd as written, then called on a tiny random Qwen3 for one prompt and a ragged
    batch of two: each row equals plain greedy decoding (full recompute per token)."""
    from conftest import tiny_qwen3
    from support.drafter_doubles import greedy_continuation, random_flashmap
    block, where = own_decoder_block()
    scope: dict = {}
    exec(compile(block, where, "exec"), scope)
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
            out = scope["speculative_decode"](model, drafter, batch, 20)
        assert [len(o) for o in out] == [20] * len(batch)
        for prompt, row in zip(batch, out):
            assert row == greedy_continuation(model, prompt, 20).tolist()


def test_own_decoder_loop_samples_the_target_joint_distribution():
    """The own-decoder block at T = 0.8 on a tiny target with 8 tokens: over 600 seeds the first 3 tokens follow
    the target's exact joint law (enumerated), so the block's first draw (position = the prompt's last token)
    and its first verify (position = the anchor's) are independent."""
    from conftest import tiny_qwen3
    from support.drafter_doubles import random_flashmap
    from support.loop_helpers import V_SMALL, assert_matches_joint
    block, where = own_decoder_block()
    scope: dict = {}
    exec(compile(block, where, "exec"), scope)
    model = tiny_qwen3(vocab_size=V_SMALL, num_layers=2, seed=3)
    drafter = random_flashmap(model, 2, (0,)).eval()  # its noise is keyed by the same seed and positions

    def run(seed):
        (row,) = scope["speculative_decode"](model, drafter, [[1, 2, 3]], 3, temperature=0.8, seed=seed)
        return row, 1  # accepted drafts are not visible to the block's caller; the law is what is checked
    assert_matches_joint(model, [1, 2, 3], run, 600, dict(temperature=0.8, top_k=0, top_p=1.0), paths=False)


def test_sampling_the_first_token_at_the_anchor_position_is_detected():
    """Power of the test above: the same block with the first draw keyed at the anchor's position (the draw the
    first verify's resample reuses) gives a joint law the chi-square rejects."""
    from conftest import tiny_qwen3
    from support.loop_helpers import V_SMALL, chi_square, exact_joint
    block, where = own_decoder_block()
    assert "position=lengths - 1" in block
    scope: dict = {}
    exec(compile(block.replace("position=lengths - 1", "position=lengths"), where, "exec"), scope)
    model = tiny_qwen3(vocab_size=V_SMALL, num_layers=2, seed=3)
    drafter = fm_dflash(model, V_SMALL - 1, 3, (0, 1))
    counts = torch.zeros(V_SMALL, V_SMALL, V_SMALL, dtype=torch.float64)
    for seed in range(600):
        (row,) = scope["speculative_decode"](model, drafter, [[1, 2, 3]], 3, temperature=0.8, seed=seed)
        counts[tuple(row[:3])] += 1
    stat, df = chi_square(counts, exact_joint(model, [1, 2, 3], temperature=0.8, top_k=0, top_p=1.0))
    assert stat > df + 10 * (2 * df) ** 0.5, (stat, df)


def fm_dflash(model, mask_token_id: int = 110, block_size: int = 5, taps=(0, 2)):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    torch.manual_seed(1)
    return DFlashDrafter.for_target(model, mask_token_id=mask_token_id, num_hidden_layers=1, block_size=block_size,
                                    target_layer_ids=list(taps), dtype=torch.float32).eval()


def cli_lines() -> list[str]:
    (block,) = re.findall(r"^```\n(flashmap .*?)^```$", section(r"\bcli\b|command[ -]line"), flags=re.S | re.M)
    commands = [cmd.split("#")[0].strip() for line in block.splitlines() for cmd in line.split(";")]
    return [c for c in commands if c]


def cli_stand_ins(cmd: str) -> str:
    """The real target → tiny-random; EAGLE-3 checkpoints → random-eagle3, FlashMap ones → random."""
    cmd = cmd.replace(f"--target {REAL_TARGET}", "--target tiny-random")
    cmd = re.sub(r"checkpoints/[\w.-]*eagle3[\w.-]*", "random-eagle3", cmd)
    return re.sub(r"checkpoints/[\w.-]*flashmap[\w.-]*", "random", cmd)


def test_cli_block_uses_no_placeholders():
    assert cli_lines()
    for cmd in cli_lines():
        assert not re.search(r"\.\.\.|\b[A-Z][A-Z0-9_]{2,}\b|\{", cmd), f"placeholder in README command: {cmd}"


@pytest.mark.parametrize("cmd", cli_lines())
def test_cli_line_runs(cmd, capsys, tmp_path, monkeypatch):
    from flashmap_ext import cli
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))  # --auto caches its cost table there
    argv = shlex.split(cmd)[1:]
    if "--help" in argv:
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0 and "usage: flashmap" in capsys.readouterr().out
        return
    if argv[0] in PARSE_ONLY:
        args = cli.build_parser().parse_args(argv)
        assert args.command == argv[0]
        return
    argv = shlex.split(cli_stand_ins(cmd))[1:]
    assert REAL_TARGET not in " ".join(argv) and "checkpoints/" not in " ".join(argv), argv
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
    """Every `flashmap_ext.<module>` the README's code names is a module of this checkout; modules that moved
    away are gone (no import hook keeps an old path alive)."""
    import importlib
    named = set(re.findall(r"\bflashmap_ext\.([a-z_][\w.]*)", readme_code()))
    assert named and not [n for n in sorted(named) if not _is_module(f"flashmap_ext.{n}")]
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
    """The plain names (no dots, no calls) of the README paragraph that cites `flashmap_ext.__all__`."""
    paragraphs = [p for p in re.split(r"\n\s*\n", README) if "flashmap_ext.__all__" in p]
    assert paragraphs, "README names no `flashmap_ext.__all__` paragraph"
    return [n for n in re.findall(r"`([^`]+)`", paragraphs[0]) if re.fullmatch(r"[A-Za-z_]\w*", n)]


def test_public_names_are_exactly_the_readmes():
    """`flashmap_ext.__all__` is the README's list, each name resolves, and every `fm.<name>` the README's code
    uses is on it."""
    import flashmap_ext as fm
    listed = public_names_paragraph()
    assert len(listed) == len(set(listed)) and sorted(listed) == sorted(fm.__all__)
    assert all(hasattr(fm, n) for n in fm.__all__)
    used = set(re.findall(r"\bfm\.([A-Za-z_]\w*)", readme_code()))
    assert used and used <= set(fm.__all__)


def test_readme_paths_exist():
    """Every repository path the README cites in backticks exists."""
    cited = set(re.findall(r"`((?:python_tests|python_tests_vllm|flashmap_ext|scripts|recipes|research|benches|"
                           r"csrc|docs|checkpoints)/[\w./-]+)`", README))
    assert cited and not [p for p in sorted(cited) if not (ROOT / p).exists()]


def test_the_training_walkthrough_runs_as_written(tmp_path):
    """The command-line section's end-to-end training block runs as written, in a fresh folder, each `flashmap`
    line through this interpreter's CLI, and ends with a drafter that generate loads."""
    import os
    import subprocess
    import sys
    blocks = [b for b in re.findall(r"^```\n(.*?)^```$", section(r"\bcli\b|command[ -]line"), flags=re.S | re.M)
              if "flashmap train flow" in b]
    assert len(blocks) == 1, "no (or more than one) training walkthrough in the command-line section"
    shim = f'flashmap() {{ "{sys.executable}" -c "import sys; from flashmap_ext.cli import main; sys.exit(main())" "$@"; }}'
    script = "set -e\n" + shim + "\n" + blocks[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLASHMAP_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "map" / "drafter" / "config.json").is_file()
    assert "tokens in" in done.stderr  # generate's stats line: the distilled map drafted
