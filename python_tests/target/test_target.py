"""Target adapter (DESIGN.md §6) on tiny random Qwen3, Qwen2 and Llama models (CPU, no downloads).

References: a plain full forward with `output_hidden_states=True` (taps = hidden_states[i + 1], logits)
and a full recompute after a rollback.
"""
import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.speculate import generate
from flashmap_ext.target import Target, resolve_dtype
from support.drafter_doubles import ScheduledRejectDrafter, greedy_continuation

V = 97


def tiny_model(arch: str, dtype=torch.float32):
    if arch == "qwen3":
        return tiny_qwen3(vocab_size=V, num_layers=3, dtype=dtype)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    cfg = config_cls(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     tie_word_embeddings=False)
    torch.manual_seed(0)
    model = model_cls(cfg).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def full_forward(model, ids: list):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True)


ARCHS = ["qwen3", "qwen2", "llama"]
IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33]


@pytest.mark.parametrize("arch", ARCHS)
def test_taps_and_logits_match_full_forward(arch):
    model = tiny_model(arch)
    target, taps = Target(model), (1, 0)
    ref = full_forward(model, IDS)
    hooks_before = [dict(layer._forward_hooks) for layer in target.layers]  # HF installs its own lazily
    cache = target.new_cache()
    first = target.forward(torch.tensor([IDS[:5]]), cache, num_logits=1, tap_layer_ids=taps)
    block = target.forward(torch.tensor([IDS[5:]]), cache, num_logits=4, tap_layer_ids=taps)
    want_taps = torch.cat([ref.hidden_states[i + 1] for i in taps], dim=-1)
    torch.testing.assert_close(torch.cat([first.taps, block.taps], dim=1), want_taps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.logits, ref.logits[:, 4:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block.logits, ref.logits[:, 5:], atol=1e-5, rtol=1e-5)
    assert first.logits.shape == (1, 1, V) and cache.get_seq_length() == len(IDS)
    assert [dict(layer._forward_hooks) for layer in target.layers] == hooks_before  # ours are gone


def test_last_layer_tap_is_hf_hidden_states_after_the_final_norm():
    """Tap L−1 = HF hidden_states[L], which HF takes after the final norm (z-lab's DFlash convention)."""
    model = tiny_model("qwen3")
    target = Target(model)
    out = target.forward(torch.tensor([IDS]), target.new_cache(), tap_layer_ids=(2,))
    ref = full_forward(model, IDS).hidden_states[3]  # HF: the last entry is after the final norm
    torch.testing.assert_close(out.taps, ref, atol=1e-5, rtol=1e-5)
    raw = []
    handle = model.model.layers[2].register_forward_hook(lambda m, a, o: raw.append(o[0] if isinstance(o, tuple) else o))
    full_forward(model, IDS)
    handle.remove()
    assert not torch.allclose(raw[0], ref, atol=1e-2)  # the convention matters: raw output != normed


@pytest.mark.parametrize("arch", ARCHS)
def test_rollback_then_forward_equals_recompute(arch):
    """Verify 4 drafts, keep 1 (drop 3), then feed 2 new tokens: logits == full recompute."""
    model = tiny_model(arch)
    target = Target(model)
    cache = target.new_cache()
    target.forward(torch.tensor([IDS[:4]]), cache)
    target.forward(torch.tensor([[IDS[4], 70, 71, 72, 73]]), cache, num_logits=5)
    target.rollback(cache, 3)
    assert cache.get_seq_length() == 6
    out = target.forward(torch.tensor([IDS[6:8]]), cache, num_logits=2)
    ref = full_forward(model, IDS[:4] + [IDS[4], 70] + IDS[6:8]).logits[:, -2:]
    torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=1e-5)
    target.rollback(cache, 0)
    assert cache.get_seq_length() == 8


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_then_keep_positions_equals_recompute(arch):
    """A tree block [anchor, a, b, b1] (a, b siblings; b1 under b) with the tree mask and depth positions:
    each node's logits == its path alone; keeping anchor, b, b1 then feeding 2 tokens == recompute."""
    from flashmap_ext.tree import tree_attention_mask
    model = tiny_model(arch)
    target, prefix, anchor = Target(model), IDS[:4], IDS[4]
    cache = target.new_cache()
    target.forward(torch.tensor([prefix]), cache)
    block, parents = torch.tensor([[anchor, 70, 71, 72]]), torch.tensor([-1, -1, 1])
    out = target.forward(block, cache, num_logits=4, tap_layer_ids=(1,),
                         attention_mask=tree_attention_mask(parents, 4, torch.float32),
                         position_ids=torch.tensor([[4, 5, 5, 6]]))
    for row, path in ((0, []), (1, [70]), (2, [71]), (3, [71, 72])):
        ref = full_forward(model, prefix + [anchor] + path)
        torch.testing.assert_close(out.logits[:, row], ref.logits[:, -1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.taps[:, row], ref.hidden_states[2][:, -1], atol=1e-5, rtol=1e-5)
    target.keep_positions(cache, torch.tensor([0, 1, 2, 3, 4, 6, 7]))
    assert cache.get_seq_length() == 7
    after = target.forward(torch.tensor([IDS[6:8]]), cache, num_logits=2)
    ref = full_forward(model, prefix + [anchor, 71, 72] + IDS[6:8]).logits[:, -2:]
    torch.testing.assert_close(after.logits, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_loop_is_greedy_identical_on_other_architectures(arch):
    model = tiny_model(arch)
    prompt, n, k = IDS[:7], 12, 3
    ref = greedy_continuation(model, prompt, n).tolist()
    drafter = ScheduledRejectDrafter(model, k, range(k + 1), target_layer_ids=(0, 1))
    out = generate(model, drafter, prompt, n)
    assert out.tokens == ref
    assert out.stats.accepted == [min(j % (k + 1), d) for j, d in enumerate(out.stats.drafted)]
    assert generate(model, None, prompt, n).tokens == ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_forward(dtype):
    model = tiny_model("qwen3", dtype=dtype)
    target = Target(model)
    assert target.dtype == dtype and target.device == torch.device("cpu")
    out = target.forward(torch.tensor([IDS]), target.new_cache(), num_logits=3, tap_layer_ids=(0, 1))
    assert out.logits.dtype == dtype and out.taps.dtype == dtype
    assert out.logits.shape == (1, 3, V) and out.taps.shape == (1, len(IDS), 128)
    assert len(generate(target, None, IDS, 5, temperature=0.8, seed=1).tokens) == 5


def test_adapter_errors():
    target = Target(tiny_model("qwen3"))
    ids = torch.tensor([IDS])
    target.forward(ids, target.new_cache())
    hooks_before = [dict(layer._forward_hooks) for layer in target.layers]
    with pytest.raises(ValueError, match="tap layer id 3 out of range for a 3-layer target"):
        target.forward(ids, target.new_cache(), tap_layer_ids=(0, 3))
    assert [dict(layer._forward_hooks) for layer in target.layers] == hooks_before
    with pytest.raises(ValueError, match="num_logits"):
        target.forward(ids, target.new_cache(), num_logits=len(IDS) + 1)
    with pytest.raises(ValueError, match="num_logits"):
        target.forward(ids, target.new_cache(), num_logits=0)
    with pytest.raises(ValueError, match="num_tokens"):
        target.rollback(target.new_cache(), -1)


def test_load_target_from_local_dir(tmp_path):
    model = tiny_model("qwen3")
    model.save_pretrained(tmp_path)
    target = Target.from_pretrained(str(tmp_path), dtype="bf16", device="cpu")
    assert target.dtype == torch.bfloat16 and target.vocab_size == V and target.num_layers == 3
    assert target.max_positions == 512 and target.hidden_size == 64
    torch.testing.assert_close(target.lm_head.weight.float(), model.lm_head.weight.bfloat16().float())


def test_resolve_dtype():
    assert resolve_dtype("fp16") is torch.float16 and resolve_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        resolve_dtype("int8")
