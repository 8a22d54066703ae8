"""The FlashMap draft's CUDA-graph path (drafters/flashmap/fused.py: graphs_enabled, draft_graph,
FusedDraftGraph): when it applies, when it captures again, and — on a GPU — graph replay == eager fused
== reference drafts (near-ties counted) over rounds of a growing memory, inside `generate` too."""
import copy

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap import fused as fused
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.speculate import generate
from flashmap_ext.target.tables import TargetTables

# Widths the CUDA kernels accept (GEMM inputs multiples of 64, head dim 64).
TINY = dict(n_layers=2, width=128, heads=2, block_size=16, cond_dim=64, target_layer_ids=(0, 2))


def make(target, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    drafter = FlashMapDrafter.for_target(target, **TINY)
    drafter.reset_parameters(zero_init=False)
    return drafter.to(device=device, dtype=dtype).attach_target(target).eval()


def extend(drafter, memory, taps):
    drafter.extend_memory(memory, torch.zeros(taps.shape[:2], dtype=torch.int64, device=taps.device), taps)


class CountingGraph(fused.FusedDraftGraph):
    """FusedDraftGraph that counts its captures; with capture=False it records the key but captures nothing."""
    captures = 0
    capture = True

    def __init__(self, p, memory, **kwargs):
        type(self).captures += 1
        if self.capture:
            super().__init__(p, memory, **kwargs)
        else:
            self.p, self.seeded, self._layout = p, kwargs.get("seeded", False), fused._layout(memory)


@pytest.fixture
def counting(monkeypatch):
    cls = type("Counting", (CountingGraph,), {"captures": 0})
    monkeypatch.setattr(fused, "FusedDraftGraph", cls)
    return cls


@pytest.fixture(scope="module")
def cpu_target():
    return tiny_qwen3(vocab_size=300, hidden_size=64)


# ------------------------------------------------------------------ dispatch (CPU)
def test_graphs_enabled_follows_the_switches(cpu_target, monkeypatch):
    drafter = make(cpu_target)
    monkeypatch.delenv("FLASHMAP_CUDA_GRAPHS", raising=False)
    assert fused.graphs_enabled(drafter)
    monkeypatch.setenv("FLASHMAP_CUDA_GRAPHS", "0")
    assert not fused.graphs_enabled(drafter)
    monkeypatch.setenv("FLASHMAP_CUDA_GRAPHS", "1")
    drafter.allow_graphs = False
    assert not fused.graphs_enabled(drafter)
    drafter.allow_graphs = True
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not fused.graphs_enabled(drafter), "never while torch.compile traces"


def test_cpu_drafting_never_captures_a_graph(cpu_target, counting):
    drafter = make(cpu_target)
    g = torch.Generator().manual_seed(1)
    taps = torch.randn(2, 9, 2 * 64, generator=g)
    anchor, seed, position = torch.tensor([3, 4]), torch.tensor([5, 6]), torch.tensor([9, 9])
    memory = drafter.new_memory(2)
    extend(drafter, memory, taps)
    ref = draft_flashmap(drafter, memory, anchor, steps=2, seed=seed, position=position)
    packed = fused.pack_weights(drafter)
    fused_mem = drafter.new_memory(2)
    fused.fused_extend_memory(packed, fused_mem, torch.zeros(2, 9, dtype=torch.int64), taps)
    out = fused.fused_draft_block(packed, fused_mem, anchor, steps=2, seed=seed, position=position, graph=True)
    assert torch.equal(out.tokens, ref.tokens)
    assert counting.captures == 0 and not memory.draft_graphs and not fused_mem.draft_graphs


def test_memory_reserve_drops_graphs_only_when_it_reallocates(cpu_target):
    memory = make(cpu_target).new_memory(1)
    memory.draft_graphs["key"] = object()
    memory.reserve(memory.capacity)
    assert "key" in memory.draft_graphs
    memory.reserve(memory.capacity + 1)
    assert not memory.draft_graphs


def test_draft_graph_is_captured_once_per_key_and_again_after_a_change(cpu_target, counting):
    counting.capture = False
    drafter = make(cpu_target)
    p, memory = fused.pack_weights(drafter), drafter.new_memory(2)
    memory.length = 10
    first = fused.draft_graph(p, memory, 2, 1, seeded=True)
    assert fused.draft_graph(p, memory, 2, 1, seeded=True) is first and counting.captures == 1
    fused.draft_graph(p, memory, 2, 2, seeded=True)
    fused.draft_graph(p, memory, 2, 1, seeded=False)
    assert counting.captures == 3, "steps and seeded are part of the key"
    memory.length = memory.capacity - 1  # growth within the capacity: replay
    assert fused.draft_graph(p, memory, 2, 1, seeded=True) is first and counting.captures == 3
    memory.reserve(memory.capacity + 1)  # reallocated buffers: capture again
    again = fused.draft_graph(p, memory, 2, 1, seeded=True)
    assert again is not first and counting.captures == 4
    fused.draft_graph(fused.pack_weights(drafter), memory, 2, 1, seeded=True)  # re-packed weights
    assert counting.captures == 5
    memory.length = memory.capacity  # no scratch slot for the anchor
    assert not again.valid_for(p, memory)


# ------------------------------------------------------------------ CUDA
def cuda_drafter(vocab_size=300):
    target = tiny_qwen3(vocab_size=vocab_size, hidden_size=64).to(torch.bfloat16).cuda()
    return target, make(target, torch.bfloat16, "cuda")


def fp64_oracle(drafter):
    oracle = copy.deepcopy(drafter).double()  # the same bf16-rounded numbers, in fp64 (reference path)
    t = drafter.tables
    oracle.attach_tables(TargetTables(t.embedding.double(), t.head_weight.double(), None))
    return oracle


@pytest.mark.cuda
@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("seeded", [True, False])
def test_graph_replay_equals_eager_fused_and_reference_over_rounds(steps, seeded, counting, record_property):
    """Rounds of draft → commit 1..16 entries, memory 40 → ~170 entries (capacity 64 → 128 → 256):
    graph tokens == eager fused tokens exactly; against the fp64 oracle they differ only at near-ties
    (the error-budget rule of test_dit_fused.py), which are counted."""
    _, drafter = cuda_drafter(vocab_size=20000)
    oracle = fp64_oracle(drafter)
    assert fused.fused_supported(drafter) and not fused.fused_supported(oracle)
    packed = drafter.fused_weights()
    g = torch.Generator().manual_seed(3)
    taps = torch.randn(2, 200, 2 * 64, generator=g).to(torch.bfloat16).cuda()
    memory, oracle_mem, lowp_mem = drafter.new_memory(2), oracle.new_memory(2), drafter.new_memory(2)
    drafter.allow_fused = False
    extend(drafter, lowp_mem, taps[:, :40])
    drafter.allow_fused = True
    extend(drafter, memory, taps[:, :40])
    extend(oracle, oracle_mem, taps[:, :40].double())
    seed, near_ties, layouts = torch.tensor([11, -12], device="cuda"), 0, set()
    for r in range(14):
        anchor = torch.randint(0, 20000, (2,), generator=g).cuda()
        position = torch.full((2,), memory.length, dtype=torch.int64, device="cuda")
        z = drafter.sample_noise(seed, position)
        kw = dict(seed=seed, position=position) if seeded else dict(noise=z)
        graphed = draft_flashmap(drafter, memory, anchor, steps=steps, **kw).tokens
        layouts.add(fused._layout(memory))
        eager = fused.fused_draft_block(packed, memory, anchor, steps=steps, **kw).tokens
        assert torch.equal(graphed, eager), f"round {r}: graph replay differs from the eager fused step"
        f = fused.fused_draft_block(packed, memory, anchor, steps=steps, noise=z, return_logits=True)
        assert torch.equal(f.tokens, eager), "the in-graph noise is the seeded noise"
        drafter.allow_fused = False
        lp = draft_flashmap(drafter, lowp_mem, anchor, steps=steps, noise=z, return_logits=True)
        drafter.allow_fused = True
        o = draft_flashmap(oracle, oracle_mem, anchor, steps=steps, noise=z.double(), return_logits=True)
        err = (f.logits.double() - o.logits).abs().max().item()
        base = (lp.logits.double() - o.logits).abs().max().item()
        assert err <= 2 * base, f"round {r}: fused logits error {err:.3g} > 2 x bf16 module error {base:.3g}"
        mismatched = graphed != o.tokens
        gap = o.logits.gather(-1, o.tokens[..., None]) - o.logits.gather(-1, graphed[..., None])
        assert (gap[..., 0][mismatched] <= 2 * base).all(), f"round {r}: a token differs away from a near-tie"
        near_ties += int(mismatched.sum())
        start, n = memory.length, 1 + (5 * r) % 16
        drafter.allow_fused = False
        extend(drafter, lowp_mem, taps[:, start:start + n])
        drafter.allow_fused = True
        extend(drafter, memory, taps[:, start:start + n])
        extend(oracle, oracle_mem, taps[:, start:start + n].double())
    record_property("near_ties", near_ties)
    assert memory.capacity >= 256 and len(layouts) >= 3, "the rounds must cross capacity doublings"
    assert counting.captures == len(layouts), "one capture per buffer layout, replays otherwise"


@pytest.mark.cuda
def test_graph_replay_syncs_nothing():
    _, drafter = cuda_drafter()
    memory = drafter.new_memory(1)
    memory.reserve(256)
    extend(drafter, memory, torch.randn(1, 40, 2 * 64, device="cuda", dtype=torch.bfloat16))
    seed, anchor = torch.tensor([7], device="cuda"), torch.tensor([5], device="cuda")
    position = torch.full((1,), 40, dtype=torch.int64, device="cuda")
    first = draft_flashmap(drafter, memory, anchor, steps=2, seed=seed, position=position).tokens  # captures
    assert memory.draft_graphs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = draft_flashmap(drafter, memory, anchor, steps=2, seed=seed, position=position).tokens
        other = draft_flashmap(drafter, memory, anchor, steps=2, seed=seed, position=position + 1).tokens
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, first) and again.data_ptr() != first.data_ptr(), "tokens are copies"
    packed = drafter.fused_weights()
    assert torch.equal(other, fused.fused_draft_block(packed, memory, anchor, steps=2, seed=seed,
                                                      position=position + 1).tokens), "inputs reach the replay"


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_with_graphs_equals_generate_without(temperature, counting, monkeypatch):
    target, drafter = cuda_drafter()
    prompt = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(4))
    run = lambda: generate(target, drafter, prompt, max_new_tokens=120, temperature=temperature, seed=3)
    graphed = run()
    captured = counting.captures
    assert 1 <= captured <= 4, "one capture per memory layout (capacity 64 → 128 → 256)"
    drafter.allow_graphs = False
    eager = run()
    assert eager.tokens == graphed.tokens and eager.stats.accepted == graphed.stats.accepted
    drafter.allow_graphs = True
    monkeypatch.setenv("FLASHMAP_CUDA_GRAPHS", "0")
    assert run().tokens == graphed.tokens
    monkeypatch.delenv("FLASHMAP_CUDA_GRAPHS")
    drafter.allow_fused = False  # the reference path: bf16 rounding may differ, so only count captures
    run()
    assert counting.captures == captured, "no graph when disabled or off the fused path"
