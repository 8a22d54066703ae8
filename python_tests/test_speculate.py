"""The decoding loop's contract (DESIGN.md §7) on tiny random Qwen3 targets (CPU, no downloads).

Independent references: plain greedy decoding with a full recompute per token (drafter_doubles.
greedy_continuation) for T = 0, and the target's exact joint distribution of the first 3 tokens, by
enumeration of every prefix in one batched forward, for T > 0.
"""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.speculate import generate
from flashmap_ext.target import Target
from support.drafter_doubles import (
    OracleDrafter,
    RandomDrafter,
    ScheduledRejectDrafter,
    greedy_continuation,
    random_flashmap,
)
from support.loop_helpers import V_SMALL, assert_matches_joint, nan_block_logits, prompt_of

K = 4            # draft length of the test drafters
NEW = 2 * K + 5  # new tokens per identity run: several full rounds plus a budget-limited last one
TAPS = (1, 2)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def greedy_reference(model, prompt: tuple, n: int) -> list:
    return greedy_continuation(model, list(prompt), n).tolist()


def make_drafter(kind: str, model):
    if kind == "ar":
        return None
    if kind == "oracle":
        return OracleDrafter(model, K, TAPS)
    if kind == "always_wrong":
        return ScheduledRejectDrafter(model, K, [0], TAPS)
    if kind == "reject_in_turn":
        return ScheduledRejectDrafter(model, K, range(K + 1), TAPS)
    if kind == "random":
        return RandomDrafter(model.config.vocab_size, K, TAPS)
    if kind == "flashmap":
        return random_flashmap(model, K, TAPS)
    if kind == "flashmap_joint":
        return random_flashmap(model, K, TAPS, joint_attention=True)
    if kind == "flashmap_gated":
        return random_flashmap(model, K, TAPS, tau_gated_input=True)
    if kind == "flashmap_wide_memory":
        return random_flashmap(model, K, TAPS, memory_width=96)
    if kind == "flashmap_head_mlp":
        return random_flashmap(model, K, TAPS, head_mlp=80)
    if kind == "flashmap_qwen3":
        return random_flashmap(model, K, TAPS, trunk="qwen3", kv_heads=2, width=model.config.hidden_size)
    if kind == "dflash":
        from flashmap_ext.drafters.dflash import DFlashDrafter
        torch.manual_seed(1)
        return DFlashDrafter.for_target(model, mask_token_id=model.config.vocab_size - 1, block_size=K + 1,
                                        num_hidden_layers=2, target_layer_ids=list(TAPS))
    raise ValueError(kind)


def expected_accepts(kind: str, drafter, drafted: list) -> list:
    """Accepted drafts per round that each double must reach at T = 0, or None if not determined."""
    if kind == "oracle":
        return drafted
    if kind in ("always_wrong", "reject_in_turn"):
        return [min(drafter.reject_slot(r + 1), k) for r, k in enumerate(drafted)]
    return None


@pytest.mark.parametrize("prompt_len", [1, 2, 17, 300])
@pytest.mark.parametrize("kind", ["ar", "oracle", "always_wrong", "reject_in_turn", "random", "flashmap",
                                  "flashmap_joint", "flashmap_gated", "flashmap_wide_memory", "flashmap_head_mlp",
                                  "flashmap_qwen3", "dflash"])
def test_greedy_identical_to_plain_greedy(model, kind, prompt_len):
    prompt = prompt_of(prompt_len)
    drafter = make_drafter(kind, model)
    out = generate(model, drafter, prompt, NEW)
    assert out.tokens == greedy_reference(model, tuple(prompt), NEW)
    want = expected_accepts(kind, drafter, out.stats.drafted)
    if want is not None:
        assert out.stats.accepted == want
    if hasattr(drafter, "last_memory"):  # memory = every committed token except the final anchor
        assert drafter.last_memory.token_ids == (prompt + out.tokens)[:-1]


def test_memory_taps_are_the_tapped_layer_outputs(model):
    """The taps the loop hands the drafter equal HF hidden_states[i + 1] of a full forward."""
    prompt = prompt_of(17)
    drafter = make_drafter("reject_in_turn", model)
    out = generate(model, drafter, prompt, NEW)
    ids = torch.tensor([(prompt + out.tokens)[:-1]])
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    want = torch.cat([hs[i + 1] for i in TAPS], dim=-1)
    got = torch.cat(drafter.last_memory.taps, dim=1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# --- stop tokens and the token budget -----------------------------------------------------------------

STOP_PROMPT = [79, 0, 94, 5, 29, 11]  # its greedy continuation starts with 2K + 2 distinct tokens


@pytest.mark.parametrize("index", range(K + 2))
def test_stop_token_ends_output_at_every_slot(model, index):
    """index 0: the prefill's token; index 1 + s: slot s (s = K: the bonus) of the first, fully
    accepted, round."""
    ref = greedy_reference(model, tuple(STOP_PROMPT), 2 * K + 2)
    assert len(set(ref)) == len(ref), "fixture drifted: pick a prompt with distinct greedy tokens"
    seen, never = [], next(t for t in range(111) if t not in ref)  # a second stop id, never emitted
    out = generate(model, OracleDrafter(model, K, TAPS), STOP_PROMPT, 2 * K + 2,
                   stop_token_ids=[ref[index], never], on_tokens=seen.append)
    assert out.tokens == ref[:index + 1]
    assert sum(seen, []) == out.tokens
    assert out.stats.rounds == (0 if index == 0 else 1)
    assert out.stats.accepted == [index - 1][:out.stats.rounds]  # nothing past the stop (test_stats_stop.py)


@pytest.mark.parametrize("budget", [1, 2, K - 1, K, K + 1, 2 * K + 1])
def test_max_new_tokens_is_exact(model, budget):
    out = generate(model, OracleDrafter(model, K, TAPS), STOP_PROMPT, budget)
    assert out.tokens == greedy_reference(model, tuple(STOP_PROMPT), 2 * K + 2)[:budget]
    remaining, drafted = budget - 1, []  # the last round drafts only what the budget allows
    while remaining > 0:
        drafted.append(min(K, remaining - 1))
        remaining -= drafted[-1] + 1
    assert out.stats.drafted == drafted and out.stats.accepted == drafted


@pytest.mark.parametrize("kind", ["ar", "oracle"])
def test_valid_vocab_masks_padding_rows(model, kind):
    """Rows >= valid_vocab are never emitted: output == greedy over the logits with those rows masked."""
    prompt, valid = prompt_of(2), 50
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1, :valid].argmax()))
    assert any(t >= valid for t in greedy_reference(model, tuple(prompt), NEW))  # the mask matters
    out = generate(model, make_drafter(kind, model), prompt, NEW, valid_vocab=valid)
    assert out.tokens == ids[len(prompt):]


def test_zero_budget_returns_nothing(model):
    assert generate(model, OracleDrafter(model, K, TAPS), [1, 2], 0).tokens == []


# --- errors and independence of calls ---------------------------------------------------------------

@pytest.mark.parametrize("prompt", [[], torch.empty(0, dtype=torch.int64),
                                    torch.empty(1, 0, dtype=torch.int64)])
def test_empty_prompt_raises(model, prompt):
    with pytest.raises(ValueError, match="empty prompt|empty list of prompts"):
        generate(model, None, prompt, 4)


@pytest.mark.parametrize("prompt_len, budget", [(513, 1), (512, 1), (500, 13)])
def test_prompt_longer_than_context_raises(model, prompt_len, budget):
    assert model.config.max_position_embeddings == 512
    want = "input_ids: prompt too long" if prompt_len > 512 else f"max_new_tokens: {budget} new tokens"
    with pytest.raises(ValueError, match=want + ".*512 positions"):
        generate(model, None, [1] * prompt_len, budget)


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match=r"input_ids: a tensor of shape \[2, 2\] holds 2 prompts"):
        generate(model, None, torch.tensor([[1, 2], [3, 4]]), 4)  # a list of prompts is a batch
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 111\), got 111"):
        generate(model, None, [1, 111], 4)
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 111\), got -3"):
        generate(model, None, [-3, 5], 4)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, None, [1, 2], 4, temperature=-1.0)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_nan_target_logits_raise(model, temperature):
    """NaN logits in a verify block (not in the prefill) end the call with a clear error."""
    with nan_block_logits(model), pytest.raises(ValueError, match="NaN"):
        generate(model, OracleDrafter(model, K, TAPS), [1, 2, 3], NEW, temperature=temperature)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_consecutive_calls_equal_fresh_objects(model, kind, temperature):
    """A call never depends on an earlier one: same target/drafter objects == fresh ones."""
    target, drafter = Target(model), make_drafter(kind, model)
    kw = dict(temperature=temperature, seed=7)
    first = generate(target, drafter, prompt_of(17), NEW, **kw)
    second = generate(target, drafter, prompt_of(2), NEW, **kw)
    again = generate(target, drafter, prompt_of(17), NEW, **kw)
    fresh_model = tiny_qwen3()
    fresh = generate(Target(fresh_model), make_drafter(kind, fresh_model), prompt_of(2), NEW, **kw)
    assert second.tokens == fresh.tokens and second.stats.accepted == fresh.stats.accepted
    assert again.tokens == first.tokens and again.stats.accepted == first.stats.accepted


# --- T > 0: the distribution of the first 3 tokens is the target's ----------------------------------

@pytest.mark.parametrize("kind, trials, filters", [
    ("oracle", 1500, dict(temperature=0.7, top_k=0, top_p=1.0)),     # ~250 bins: more trials
    ("flashmap", 800, dict(temperature=0.8, top_k=5, top_p=0.9)),    # ~40 bins
])
def test_sampling_matches_target_joint_distribution(kind, trials, filters):
    model = tiny_qwen3(vocab_size=V_SMALL, num_layers=2, seed=3)
    prompt = [1, 2, 3]
    drafter = OracleDrafter(model, 2, TAPS[:1]) if kind == "oracle" else random_flashmap(model, 2, TAPS[:1])
    if kind == "oracle":  # memoised: contexts repeat across trials
        drafter.propose = _memo_oracle(model)
    target = Target(model)

    def run(seed):
        out = generate(target, drafter, prompt, 3, seed=seed, **filters)
        return out.tokens, sum(out.stats.accepted)
    assert_matches_joint(model, prompt, run, trials, filters)


def _memo_oracle(model):
    cache = {}

    def propose(memory, anchor, k, seed, position):
        key = (tuple(memory.token_ids), anchor, k)
        if key not in cache:
            cache[key] = greedy_continuation(model, list(key[0]) + [anchor], k)[None]
        return cache[key].clone()
    return propose
