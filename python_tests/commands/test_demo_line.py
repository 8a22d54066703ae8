"""`flashmap demo`'s line per prompt (commands/demo.decode_prompt) on the tiny-random target."""
from types import SimpleNamespace

import flashmap_ext as fm
from flashmap_ext.commands.demo import decode_prompt


def test_demo_line_of_a_call_without_rounds_says_gamma_is_not_defined(capsys):
    """--max-new-tokens 1: the prefill's token alone, no round, so no γ (it printed nan)."""
    target, tokenizer = fm.load_target("tiny-random", "fp32", "cpu")[:2]
    prompt = SimpleNamespace(id="p1", dataset="mine", turns=["hi"], messages=[{"role": "user", "content": "hi"}])
    flashmap, ar = decode_prompt(target, tokenizer, None, prompt, 1, stop=None)
    assert len(flashmap.tokens) == len(ar.tokens) == 1 and flashmap.accepted == []
    assert "[FlashMap: 1 tokens, γ n/a (no round after prefill), " in capsys.readouterr().out
