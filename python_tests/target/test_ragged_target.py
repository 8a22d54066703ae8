"""Public target helpers for someone else's HF model: `capture_taps` against HF's own
`output_hidden_states`, and a ragged batch in one DynamicCache (`left_pad`, `ragged_inputs`,
`rollback_rows`) against plain single-row HF forwards without a cache. Tiny random Qwen3, fp32, CPU."""
import pytest
import torch
from transformers import DynamicCache

from conftest import tiny_qwen3
from flashmap_ext.target import cache_kwarg, capture_taps
from flashmap_ext.target.ragged import left_pad, ragged_inputs, rollback_rows

TOL = dict(atol=1e-4, rtol=1e-4)  # a batched, padded forward rounds differently from a solo one


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def test_capture_taps_are_hf_hidden_states(model):
    ids = torch.randint(0, 111, (2, 7))
    layers = (0, 2, 3)  # 3 = the last layer: after the final norm, as HF's hidden_states[4]
    hooks = sum(len(m._forward_hooks) for m in model.modules())  # transformers' own, if any
    with capture_taps(model, layers) as capture:
        model(input_ids=ids)
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks  # ours are gone after the block
    hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(capture.taps, torch.cat([hidden[i + 1] for i in layers], dim=-1))
    with pytest.raises(ValueError, match="target_layer_ids"), capture_taps(model, (4,)):
        pass


def test_capture_taps_of_the_target_wrapper_says_to_pass_its_model(model):
    from flashmap_ext.target import Target
    with pytest.raises(TypeError, match=r"^Target: cannot find the decoder layers .*wraps a Hugging Face model: "
                                        r"pass its \.model$"), capture_taps(Target(model), (0,)):
        pass


def test_cache_kwarg_is_the_name_the_forward_takes(model):
    """transformers 5.24 renamed `past_key_values` to `cache` (the old name warns, and goes in 5.40); 5.17-5.23
    know only `past_key_values`. `cache_kwarg` gives the forward's own name, and a forward called with it
    warns about neither."""
    import inspect
    import warnings

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return past_key_values

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return cache
    assert (cache_kwarg(Old()), cache_kwarg(New())) == ("past_key_values", "cache")
    assert Old()(**{cache_kwarg(Old()): 7}) == New()(**{cache_kwarg(New()): 7}) == 7
    name = cache_kwarg(model)
    assert name in inspect.signature(model.forward).parameters
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(past_key_values|cache).*", category=FutureWarning)
        model(input_ids=torch.randint(0, 111, (1, 4)), use_cache=True, **{name: cache})
    assert cache.get_seq_length() == 4


def _forward(model, cache, ids, lengths):
    mask, pos = ragged_inputs(lengths, ids.shape[1])
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                 **{cache_kwarg(model): cache}).logits


def _solo_logits(model, row):
    return model(input_ids=torch.tensor([row])).logits[0]


def test_ragged_cache_rollback_keeps_each_rows_prefix(model):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 111, (n,), generator=g).tolist() for n in (7, 13, 4)]
    ids, lengths = left_pad(prompts)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = _forward(model, cache, ids, lengths)
        for b, p in enumerate(prompts):  # prefill: each row's real positions equal its solo forward
            torch.testing.assert_close(logits[b, -len(p):], _solo_logits(model, p), **TOL)
        rows = [list(p) for p in prompts]
        for kept in ([1, 4, 2], [3, 1, 4], [4, 4, 1]):  # rounds of T = 4 new tokens, rows keeping different counts
            block = torch.randint(0, 111, (3, 4), generator=g)
            lengths = lengths + 4
            logits = _forward(model, cache, block, lengths)
            for b in range(3):
                torch.testing.assert_close(logits[b], _solo_logits(model, rows[b] + block[b].tolist())[-4:], **TOL)
                rows[b] += block[b, :kept[b]].tolist()
            lengths = rollback_rows(cache, lengths, 4 - torch.tensor(kept))
            assert lengths.tolist() == [len(r) for r in rows]
            assert cache.get_seq_length() == max(len(r) for r in rows)  # the all-padding columns are cropped


def test_rollback_rows_refuses_bad_counts(model):
    ids, lengths = left_pad([[1, 2, 3], [4, 5]])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        _forward(model, cache, ids, lengths)
    with pytest.raises(ValueError, match="num_tokens"):
        rollback_rows(cache, lengths, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="prompts"):
        left_pad([[1], []])
