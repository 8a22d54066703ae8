"""StaticTarget (target/static.py) on tiny random Qwen3, Qwen2 and Llama models, on the CPU (the same code the
CUDA graphs capture). References: HF transformers' own forward (logits, hidden states), a full recompute
after a rollback, plain greedy decoding with a full recompute per token (drafter_doubles.greedy_continuation),
and the target's host reads counted by a torch function mode (support/sync_counter.py). The rounds that
generate(..., cuda_graphs=True) runs on it (bookkeeping on the device, one host read): test_graphed_round.py."""
import pytest
import torch
from test_target import ARCHS, IDS, full_forward, tiny_model

from flashmap_ext.speculate import generate
from flashmap_ext.target import Target
from flashmap_ext.target.static import StaticTarget
from support.drafter_doubles import ScheduledRejectDrafter, greedy_continuation, random_flashmap
from support.sync_counter import SyncCounter


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_taps_equal_hf(arch):
    model = tiny_model(arch)
    target = StaticTarget(model, capacity=32)
    ref = full_forward(model, IDS)
    cache = target.new_cache()
    first = target.forward(torch.tensor([IDS[:5]]), cache, num_logits=2, tap_layer_ids=(1, 2))
    block = target.forward(torch.tensor([IDS[5:]]), cache, num_logits=4, tap_layer_ids=(1, 2))
    torch.testing.assert_close(first.logits, ref.logits[:, 3:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block.logits, ref.logits[:, 5:], atol=1e-5, rtol=1e-5)
    want = torch.cat([ref.hidden_states[2], ref.hidden_states[3]], dim=-1)  # the last one after the final norm
    torch.testing.assert_close(torch.cat([first.taps, block.taps], dim=1), want, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == len(IDS) and int(cache.length) == len(IDS)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollback_is_a_length_update(arch):
    """Verify 4 drafts, keep 1 (drop 3), feed 2 tokens: logits == full recompute (the stale slots are
    overwritten and masked, never read)."""
    model = tiny_model(arch)
    target = StaticTarget(model, capacity=16)
    cache = target.new_cache()
    target.forward(torch.tensor([IDS[:4]]), cache)
    target.forward(torch.tensor([[IDS[4], 70, 71, 72, 73]]), cache, num_logits=5)
    target.rollback(cache, 3)
    assert cache.get_seq_length() == 6 and int(cache.length) == 6
    out = target.forward(torch.tensor([IDS[6:8]]), cache, num_logits=2)
    ref = full_forward(model, IDS[:4] + [IDS[4], 70] + IDS[6:8]).logits[:, -2:]
    torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=1e-5)


def test_bf16_forward_follows_hf_within_bf16_rounding():
    model = tiny_model("qwen3", dtype=torch.bfloat16)
    target = StaticTarget(model, capacity=16)
    out = target.forward(torch.tensor([IDS]), target.new_cache(), num_logits=3)
    ref = full_forward(model, IDS).logits[:, -3:]
    assert out.logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.logits.float(), ref.float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("drafter_kind", ["none", "scheduled", "flashmap"])
def test_generate_with_cuda_graphs_is_plain_greedy(arch, drafter_kind):
    model = tiny_model(arch)
    prompt, n, k = IDS[:7], 14, 3
    ref = greedy_continuation(model, prompt, n).tolist()
    drafter = {"none": None, "scheduled": ScheduledRejectDrafter(model, k, range(k + 1), target_layer_ids=(0, 1)),
               "flashmap": random_flashmap(model, k, (0, 1))}[drafter_kind]
    target = Target(model)
    out = generate(target, drafter, prompt, n, cuda_graphs=True)
    assert out.tokens == ref
    static = target._static  # kept for the next call: same buffers, reset
    assert isinstance(static, StaticTarget) and static.capacity >= len(prompt) + n
    assert generate(target, drafter, prompt, n, cuda_graphs=True).tokens == ref and target._static is static
    if drafter_kind == "scheduled":
        assert out.stats.accepted == [min(j % (k + 1), d) for j, d in enumerate(out.stats.drafted)]


def test_sampling_with_cuda_graphs_equals_the_dynamic_cache_loop():
    """T > 0: the verifier's coins are keyed by (seed, position), so the same logits give the same tokens."""
    model = tiny_model("qwen3")
    drafter = ScheduledRejectDrafter(model, 3, [0, 2, 3])
    kwargs = dict(temperature=0.9, top_k=20, seed=7)
    assert generate(model, drafter, IDS[:5], 12, cuda_graphs=True, **kwargs).tokens == \
        generate(model, drafter, IDS[:5], 12, **kwargs).tokens


def test_the_target_never_reads_the_device():
    target = StaticTarget(tiny_model("qwen3"), capacity=32)
    cache = target.new_cache()
    with SyncCounter() as sync:
        target.forward(torch.tensor([IDS[:5]]), cache, num_logits=1, tap_layer_ids=(0, 2))
        target.forward(torch.tensor([IDS[5:]]), cache, num_logits=4, tap_layer_ids=(0, 2))
        target.rollback(cache, 2)
    assert sync.calls == []


def test_errors_name_the_argument():
    model = tiny_model("qwen3")
    target = StaticTarget(model, capacity=8)
    cache = target.new_cache()
    ids = torch.tensor([IDS[:3]])
    with pytest.raises(ValueError, match="attention_mask"):
        target.forward(ids, cache, attention_mask=torch.ones(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_logits"):
        target.forward(ids, cache, num_logits=4)
    with pytest.raises(ValueError, match="tap layer id 3 out of range"):
        target.forward(ids, cache, tap_layer_ids=(3,))
    target.forward(ids, cache)
    with pytest.raises(ValueError, match="capacity of 8"):
        target.forward(torch.tensor([IDS[:6]]), cache)
    with pytest.raises(ValueError, match="num_tokens"):
        target.rollback(cache, 4)
    target.new_cache()
    with pytest.raises(RuntimeError, match="one cache at a time"):
        target.forward(ids, cache)
    with pytest.raises(ValueError, match="capacity"):
        StaticTarget(model, capacity=10**6)
    with pytest.raises(ValueError, match="cuda_graphs"):
        generate(model, None, [IDS[:3], IDS[:4]], 4, cuda_graphs=True)


@pytest.mark.cuda
def test_graph_replays_equal_eager_forwards_on_cuda():
    """bf16 on the GPU: the graphed T = 1 and T = 4 forwards (warm-up, capture, replays) equal the eager ones
    bitwise, and generate with graphs is token-identical to generate without."""
    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    graphed = StaticTarget(model, capacity=64, graph_tokens=(1, 4))
    eager = StaticTarget(model, capacity=64)
    caches = graphed.new_cache(), eager.new_cache()
    prompt = torch.tensor([IDS], device="cuda")
    for t in (graphed, eager):
        t.forward(prompt, caches[t is eager])
    for step in range(6):
        ids = torch.tensor([[3 + step] * (1 if step % 2 else 4)], device="cuda")
        outs = [t.forward(ids, c, num_logits=ids.shape[1], tap_layer_ids=(0, 2)) for t, c in zip((graphed, eager), caches)]
        assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].taps, outs[1].taps)
        for t, c in zip((graphed, eager), caches):
            t.rollback(c, 1)
    assert len([g for g in graphed._graphs.values() if g != "warm"]) == 2
    assert generate(Target(model), None, IDS, 16, cuda_graphs=True).tokens == generate(eager, None, IDS, 16).tokens
