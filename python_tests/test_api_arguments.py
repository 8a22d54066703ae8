"""Public API argument handling tried as a user would: every bad argument raises an error that
names it (no obscure overflow / attribute errors, no silent truncation, no garbage from a meta tensor)."""
import math

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import ops
from flashmap_ext.speculate import generate
from support.drafter_doubles import greedy_continuation

V = 10


@pytest.fixture
def case():
    return torch.randn(2, 4, V), torch.randint(0, V, (2, 3))


@pytest.mark.parametrize("kw, error, message", [
    (dict(temperature=math.nan), ValueError, "temperature is NaN"),
    (dict(temperature=[0.0, 1.0]), TypeError, "temperature must be a python number or a \\[B\\] tensor"),
    (dict(temperature="0.5"), TypeError, "temperature must be a python number"),
    (dict(top_p=math.nan), ValueError, "top_p is NaN"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=-0.1), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(top_k=1.5), TypeError, "top_k must be an integer"),
    (dict(seed=2**64), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    (dict(seed=1.5), TypeError, "seed must be an integer"),
    (dict(position=2**63), ValueError, r"position must be in \[0, 2\*\*63\)"),
])
def test_verify_scalar_arguments_are_checked(case, kw, error, message):
    logits, drafts = case
    with pytest.raises(error, match=message):
        ops.verify(logits, drafts, **kw)


def test_verify_huge_top_k_is_off(case):
    logits, drafts = case
    for top_k in (V, 2**31, 2**40):  # >= V is off; above int32 used to overflow
        out = ops.verify(logits, drafts, temperature=1.0, top_k=top_k, seed=3, position=0)
        assert torch.equal(out.tokens, ops.verify(logits, drafts, temperature=1.0, seed=3, position=0).tokens)
    B = 64  # an int64 [B] tensor is clamped, not wrapped to int32 (2**32 + 1 used to become top-1)
    many = logits[:1].expand(B, -1, -1), torch.full((B, 3), -1)
    out = ops.verify(*many, temperature=1.0, top_k=torch.full((B,), 2**32 + 1), seed=torch.arange(B), position=0)
    assert torch.equal(out.tokens, ops.verify(*many, temperature=1.0, seed=torch.arange(B), position=0).tokens)
    assert out.tokens[:, 0].unique().numel() > 1


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=torch.tensor([1.0, math.nan])),
     r"temperature must be finite and >= 0 \(0 = greedy\) .* float32 tensor; rows \[1\]"),
    # a scalar -1 was refused but a [B] row of -1 ran as a greedy row, +inf as a uniform sampler
    (dict(temperature=torch.tensor([0.0, -1.0])), r"temperature must be finite and >= 0 .* rows \[1\] hold \[-1.0\]"),
    (dict(temperature=torch.tensor([math.inf, 0.5])), r"temperature must be finite and >= 0 .* rows \[0\] hold \[inf\]"),
    (dict(temperature=torch.tensor([-0.5, 1.0], dtype=torch.float64)), r"temperature must be finite .* rows \[0\]"),
    (dict(top_p=torch.tensor([0.5, 1.5])),
     r"top_p must be in \[0, 1\] \(1 = off\) .* rows \[1\] hold \[1.5\]"),
    (dict(top_p=torch.tensor([-0.1, 1.0], dtype=torch.float64)), r"top_p must be in \[0, 1\] .* rows \[0\]"),
    (dict(top_p=torch.tensor([math.nan, 1.0])), r"top_p must be in \[0, 1\] .* rows \[0\]"),
    (dict(top_k=torch.tensor([-1, 3], dtype=torch.int32)),
     r"top_k must be >= 0 \(0 = off\) .* int32 tensor; rows \[0\]"),
    (dict(top_k=torch.tensor([5, -2**40])), r"top_k must be >= 0 .* rows \[1\]"),
])
@pytest.mark.parametrize("check", [True, False])
def test_verify_tensor_arguments_are_range_checked(case, kw, message, check):
    """The scalar checks, for [B] tensors too: a CPU tensor is checked on the host (no sync), whatever `check`;
    the message names the argument, its range, the [B] shape and dtype, and the rows."""
    logits, drafts = case
    with pytest.raises(ValueError, match=r"verify: " + message) as err:
        ops.verify(logits, drafts, **{"temperature": 1.0, **kw}, check=check)
    assert "in every row of the [B] = [2]" in str(err.value)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.mark.parametrize("args, kw, error, message", [
    (([1.5, 2.0], 3), {}, TypeError, "input_ids: expected integer token ids"),
    ((torch.tensor([1.0, 2.0]), 3), {}, TypeError, "input_ids: expected integer token ids"),
    (("Hello", 4), {}, TypeError, r"input_ids: text \(str 'Hello'\), not token ids: tokenize it first"),
    (([1, 2], 1.5), {}, TypeError, "max_new_tokens must be an integer"),
    (([1, 2], None), {}, TypeError, "max_new_tokens must be an integer"),
    (([1, 2], 3), dict(temperature=math.nan), ValueError, "temperature must be finite"),
    (([1, 2], 3), dict(temperature=math.inf), ValueError, "temperature must be finite"),
    (([1, 2], 3), dict(seed=2**70), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    (([1, 2], 3), dict(seed=0.5), TypeError, "seed must be an integer"),
    (([1, 2], 8), dict(seed=[1, 2]), ValueError,
     r"seed: a list needs one prompt per value \(one row each\): got 2 values for 1 prompt"),
    (([1, 2], [8, 4]), {}, ValueError,
     r"max_new_tokens: a list needs one prompt per value \(one row each\): got 2 values for 1 prompt"),
    (([1, 2], 3), dict(valid_vocab=2.5), TypeError, "valid_vocab must be an integer, got 2.5"),
    (([1, 2], 3), dict(valid_vocab=True), TypeError, "valid_vocab must be an integer, got True"),
    (([[1, 2], [3]], 3), dict(valid_vocab=2.5), TypeError, "valid_vocab must be an integer, got 2.5"),
])
def test_generate_arguments_are_checked(model, args, kw, error, message):
    with pytest.raises(error, match=message):
        generate(model, None, *args, **kw)


@pytest.mark.parametrize("target, drafter, message", [
    ("model", "random", r"drafter: expected None .* got str 'random' .*from_pretrained"),
    ("model", object(), r"drafter: expected None .* got object \(it lacks target_layer_ids, new_memory, "
                        r"extend_memory, num_draft_tokens, draft\)"),
    (None, None, r"target: expected a Target or a Hugging Face causal LM, got None"),
    ("Qwen/Qwen3-8B", None, r"target: .* got str 'Qwen/Qwen3-8B' .*fm.load_target"),
])
def test_generate_names_a_wrong_target_or_drafter(model, target, drafter, message):
    """Generate(target, "random", ...) and generate(None, ...) raised a raw AttributeError."""
    with pytest.raises(TypeError, match=message):
        generate(model if target == "model" else target, drafter, [1, 2], 3)
    with pytest.raises(TypeError, match=message):  # a batch of prompts too
        generate(model if target == "model" else target, drafter, [[1, 2], [3]], 3)


def test_generate_empty_prompt_list_says_no_prompts(model):
    with pytest.raises(ValueError, match="^input_ids: an empty list of prompts"):
        generate(model, None, [], 3)


def test_generate_stop_token_ids_forms(model):
    prompt = [1, 2, 3]
    ref = greedy_continuation(model, prompt, 6).tolist()
    assert generate(model, None, prompt, 6, stop_token_ids=None).tokens == ref
    first = ref[0]
    for stop in (first, torch.tensor(first), [first], torch.tensor([first])):
        assert generate(model, None, prompt, 6, stop_token_ids=stop).tokens == [first]


def test_generate_huge_top_k_is_off(model):
    a = generate(model, None, [1, 2], 4, temperature=1.0, top_k=2**40, seed=5).tokens
    assert a == generate(model, None, [1, 2], 4, temperature=1.0, seed=5).tokens


def greedy_by_hand(logits: list, drafts: list) -> tuple[list, int]:
    """Plain-Python greedy acceptance of one row (DESIGN.md §3.1): accept while the draft is the argmax
    (lowest index on ties), then emit the argmax; ids outside [0, V) are no draft."""
    argmax = lambda row: max(range(len(row)), key=lambda i: (row[i], -i))
    tokens = []
    for slot, draft in enumerate(drafts):
        best = argmax(logits[slot])
        if draft != best:
            return tokens + [best] + [-1] * (len(drafts) - slot), slot
        tokens.append(draft)
    return tokens + [argmax(logits[-1])], len(drafts)


@pytest.mark.parametrize("bad", [200000, 151936, V, -5, -2, -(2**63)])
def test_verify_refuses_draft_ids_outside_the_vocabulary(bad):
    """An id outside [0, V) other than -1 (a drafter for another vocabulary, an off-by-one mask id) was
    silently taken for a rejection with check=True, the default."""
    logits = torch.randn(2, 4, V, generator=torch.Generator().manual_seed(3))
    drafts = logits[:, :3].argmax(-1)                     # all accepted ...
    drafts[1, 1] = bad                                    # ... but one id no vocabulary of V ids holds
    with pytest.raises(ValueError, match=rf"draft_tokens must be ids in \[0, V\) = \[0, {V}\) or -1 "
                                         rf"\(no draft\); \[row, slot\] \[\[1, 1\]\] hold \[{bad}\]"):
        ops.verify(logits, drafts)
    out = ops.verify(logits, drafts, check=False)         # unchecked: as before, a rejection at that slot
    for row in range(2):
        tokens, n = greedy_by_hand(logits[row].tolist(), drafts[row].tolist())
        assert out.tokens[row].tolist() == tokens and int(out.num_accepted[row]) == n


def test_verify_checked_takes_minus_one_and_every_id_in_range():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 4, V, generator=g)
    drafts = torch.tensor([[-1, 0, V - 1], [0, -1, -1], [V - 1, 0, 5]])
    drafts[2] = logits[2, :3].argmax(-1)
    out = ops.verify(logits, drafts)                      # check=True: no error
    for row in range(3):
        tokens, n = greedy_by_hand(logits[row].tolist(), drafts[row].tolist())
        assert out.tokens[row].tolist() == tokens and int(out.num_accepted[row]) == n
