"""The chain round with cuda_graphs (speculate.static_round, round_commit.RoundCommit): the bookkeeping on the
device, on tiny random models on the CPU (the same device code the CUDA graph captures). References: plain
greedy decoding with a full recompute per token (drafter_doubles.greedy_continuation), the eager memory
extension of the accepted prefix, and the host reads counted by a torch function mode (support/sync_counter.py)."""
import functools
import importlib

import pytest
import torch
from test_target import IDS, tiny_model

import flashmap_ext as fm
from flashmap_ext import speculate
from flashmap_ext.drafters.flashmap import fused
from flashmap_ext.round_commit import RoundCommit
from flashmap_ext.speculate import generate
from flashmap_ext.target import Target
from flashmap_ext.target.static import StaticTarget
from support.drafter_doubles import OracleDrafter, ScheduledRejectDrafter, greedy_continuation, random_flashmap
from support.sync_counter import SyncCounter


def dflash(model, k: int = 4):
    torch.manual_seed(1)
    return fm.DFlashDrafter.for_target(model, mask_token_id=90, num_hidden_layers=2, block_size=k + 1,
                                       target_layer_ids=[0, 2], dtype=model.dtype).eval()


def counted_flashmap(model, k: int = 4):
    """A FlashMap drafter whose memory takes the counted write ("counted" mode) here too: the fused ops'
    CPU implementations behind `memory_writer`, as the fused kernels are on CUDA."""
    drafter = random_flashmap(model, k, (0, 1))
    drafter.memory_writer = lambda device: functools.partial(fused.fused_write_memory, fused.pack_weights(drafter))
    return drafter


DRAFTERS = {"none": lambda m: None, "flashmap": lambda m: random_flashmap(m, 4, (0, 1)), "dflash": dflash,
            "flashmap-counted": counted_flashmap, "oracle": lambda m: OracleDrafter(m, 4),
            "scheduled": lambda m: ScheduledRejectDrafter(m, 4, [0, 4, 2, 1, 3])}
MODES = {"none": "none", "flashmap": "block", "dflash": "block", "flashmap-counted": "counted", "oracle": "after",
         "scheduled": "after"}


def commits(monkeypatch) -> list:
    """The RoundCommits generate creates from now on, in order."""
    made = []

    class Recorded(RoundCommit):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(speculate, "RoundCommit", Recorded)
    return made


@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_graphed_rounds_are_plain_greedy(kind, monkeypatch):
    model = tiny_model("qwen3")
    made = commits(monkeypatch)
    prompt, n = IDS[:6], 17
    out = generate(Target(model), DRAFTERS[kind](model), prompt, n, cuda_graphs=True)
    assert out.tokens == greedy_continuation(model, prompt, n).tolist()
    assert [c.mode for c in made] == [MODES[kind]]
    assert out.stats.rounds >= 2 and len(out.tokens) == n
    if kind in ("oracle", "scheduled"):  # the memory contract: every committed token but the last anchor
        assert made[0].memory.token_ids == prompt + out.tokens[:-1]
    if kind == "scheduled":
        assert out.stats.accepted == [min(s, d) for s, d in zip([0, 4, 2, 1, 3] * 9, out.stats.drafted)]


@pytest.mark.parametrize("kind", ["oracle", "scheduled"])
def test_stop_tokens_and_sampling_equal_the_chain_rounds(kind):
    """A stop token inside an accepted run ends the output with the same tokens and stats as chain_round; at
    T > 0 the verifier's coins are keyed by (seed, position): the same drafts give the same tokens."""
    model = tiny_model("qwen3")
    ref = greedy_continuation(model, IDS[:6], 20).tolist()
    for kwargs in (dict(stop_token_ids=[ref[9]]), dict(temperature=0.8, top_k=30, seed=3)):
        graphed = generate(model, DRAFTERS[kind](model), IDS[:6], 20, cuda_graphs=True, **kwargs)
        plain = generate(model, DRAFTERS[kind](model), IDS[:6], 20, **kwargs)
        assert graphed.tokens == plain.tokens and graphed.stats.accepted == plain.stats.accepted
    assert graphed.stats.rounds >= 2 and len(plain.tokens) == 20
    stopped = generate(model, DRAFTERS[kind](model), IDS[:6], 20, cuda_graphs=True, stop_token_ids=[ref[9]])
    assert stopped.tokens == ref[:ref.index(ref[9]) + 1]


@pytest.mark.parametrize("kind", ["flashmap", "flashmap-counted", "dflash"])
def test_the_memory_after_graphed_rounds_equals_the_chain_rounds(kind):
    """The memory a call leaves (entries of every committed position but the anchor) equals the one of the
    round that extends it with the accepted prefix after its host read (chain_round)."""
    model = tiny_model("qwen3")
    drafter = DRAFTERS[kind](model)
    memories = []
    new_memory = drafter.new_memory
    drafter.new_memory = lambda *a: memories.append(new_memory(*a)) or memories[-1]
    graphed = generate(Target(model), drafter, IDS[:6], 15, cuda_graphs=True)
    plain = generate(Target(model), drafter, IDS[:6], 15)
    assert graphed.tokens == plain.tokens and memories[0].rows == memories[1].rows
    n = memories[0].rows[0]
    if kind == "dflash":
        pairs = [(a[:, :, :n], b[:, :, :n]) for a, b in zip(memories[0].key_buffers, memories[1].key_buffers)]
    else:
        pairs = [(memories[0].k[..., :n, :], memories[1].k[..., :n, :]),
                 (memories[0].v[..., :n, :], memories[1].v[..., :n, :])]
    for got, want in pairs:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_counted_write_keeps_count_positions():
    """fused_write_memory with count c writes exactly the first c of T positions (entries past them stay as
    they were), equal to fused_extend_memory of those c."""
    model = tiny_model("qwen3")
    drafter = random_flashmap(model, 4, (0, 1))
    packed = fused.pack_weights(drafter)
    taps = torch.randn(1, 9, 2 * 64)
    ids = torch.zeros(1, 9, dtype=torch.int64)
    want, got = drafter.new_memory(1, "cpu"), drafter.new_memory(1, "cpu")
    for memory in (want, got):
        fused.fused_extend_memory(packed, memory, ids[:, :4], taps[:, :4])
    fused.fused_extend_memory(packed, want, ids[:, 4:7], taps[:, 4:7])
    before = got.k.clone()
    got.reserve(4 + 5)
    fused.fused_write_memory(packed, got, ids[:, 4:9], taps[:, 4:9], torch.tensor([4], dtype=torch.int32),
                             torch.tensor([3], dtype=torch.int32))
    got.grow(3)
    torch.testing.assert_close(got.k[..., :7, :], want.k[..., :7, :], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got.v[..., :7, :], want.v[..., :7, :], atol=1e-6, rtol=1e-6)
    assert torch.equal(got.k[..., 7:9, :], before[..., 7:9, :]) and got.rows == [7]
    with pytest.raises(ValueError, match="reserve"):
        long = torch.zeros(1, got.capacity - 6, dtype=torch.int64)  # 7 + capacity − 6 entries: one too many
        fused.fused_write_memory(packed, got, long, torch.randn(1, long.shape[1], 2 * 64),
                                 torch.tensor([7], dtype=torch.int32), torch.tensor([1], dtype=torch.int32))


def test_rollback_on_device_then_settle_equals_rollback():
    model = tiny_model("qwen3")
    a, b = StaticTarget(model, capacity=32), StaticTarget(model, capacity=32)
    caches = a.new_cache(), b.new_cache()
    for t, c in zip((a, b), caches):
        t.forward(torch.tensor([IDS]), c)
    a.rollback(caches[0], 3)
    b.rollback_on_device(caches[1], torch.tensor([3]))
    assert caches[1].host_length == len(IDS) and int(caches[1].length) == len(IDS) - 3  # host: an upper bound
    b.settle_host_length(caches[1], 3)
    assert caches[1].host_length == caches[0].host_length == len(IDS) - 3
    outs = [t.forward(torch.tensor([[7, 8]]), c, num_logits=2) for t, c in zip((a, b), caches)]
    torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=0, rtol=0)
    with pytest.raises(ValueError, match="num_tokens"):
        b.settle_host_length(caches[1], 100)


def round_reads(monkeypatch, drafter_kind: str, device: str = "cpu") -> list:
    """The host reads (file:function) of every round of a cuda_graphs call, draft + forward + verify +
    bookkeeping, after a first call for one-time work (the drafter's memoised tables). The argument checks
    that read CPU tensors only (verify's row values, the drafter's anchor ids: skipped on CUDA, where the
    kernels flag bad values) are switched off as on CUDA."""
    monkeypatch.setattr(importlib.import_module("flashmap_ext.ops.verify"), "_check_row_values", lambda *a: None)
    monkeypatch.setattr(importlib.import_module("flashmap_ext.drafters.common.base"), "host_readable",
                        lambda t: False)
    model = tiny_model("qwen3").to(device)
    drafter = fused_flashmap(model) if drafter_kind == "flashmap-fused" else DRAFTERS[drafter_kind](model)
    target = Target(model)
    generate(target, drafter, IDS[:5], 14, cuda_graphs=True)
    rounds, static_round = [], speculate.static_round

    def counted(*args, **kwargs):
        with SyncCounter() as sync:
            static_round(*args, **kwargs)
        rounds.append(sync.sites)
    monkeypatch.setattr(speculate, "static_round", counted)
    generate(target, drafter, IDS[:5], 14, cuda_graphs=True)
    return rounds


@pytest.mark.parametrize("kind", ["none", "flashmap", "flashmap-counted", "dflash"])
def test_a_graphed_round_reads_the_device_once(kind, monkeypatch):
    """Exactly one host read per round, the readback in static_round: the draft, the forward, the verify op
    and the whole bookkeeping (rollback, memory, next anchor, stats, emit) read nothing."""
    rounds = round_reads(monkeypatch, kind)
    assert len(rounds) >= 3 and all(sites == ["speculate.py:static_round"] for sites in rounds), rounds


@pytest.mark.parametrize("where", ["rollback", "memory"])
def test_the_read_count_catches_an_injected_read(where, monkeypatch):
    """The counter sees a host read slipped into the bookkeeping: an `.item()` of the rollback count, an
    int() of a memory position."""
    if where == "rollback":
        rollback = StaticTarget.rollback_on_device
        monkeypatch.setattr(StaticTarget, "rollback_on_device", lambda self, c, t: rollback(self, c, t.item()))
    else:
        write = fused.fused_write_memory
        monkeypatch.setattr(fused, "fused_write_memory",
                            lambda p, m, ids, taps, start, count: write(p, m, ids, taps, start, count[:int(count[0])]))
    rounds = round_reads(monkeypatch, "flashmap-counted")
    assert rounds and all(sites == ["round_commit.py:_device_part", "speculate.py:static_round"]
                          for sites in rounds), rounds


def test_cuda_graphs_refusals_name_the_argument():
    model = tiny_model("qwen3")
    with pytest.raises(ValueError, match="cuda_graphs"):
        generate(model, None, [IDS[:3], IDS[:4]], 4, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs"):
        generate(model, None, IDS[:3], 4, cuda_graphs=True, tree=fm.TreeSpec(2, 2, 3))


def fused_flashmap(model):
    """A bf16 FlashMap drafter of a shape the fused CUDA kernels take (its memory "counted" on a GPU)."""
    torch.manual_seed(1)
    drafter = fm.FlashMapDrafter.for_target(model, n_layers=2, width=128, heads=2, block_size=4, cond_dim=64,
                                            target_layer_ids=(0, 2), init="random").to("cuda", torch.bfloat16)
    assert drafter.memory_writer(torch.device("cuda")) is not None, "the fused kernels take this shape"
    return drafter


@pytest.mark.cuda
def test_a_graphed_round_reads_the_device_once_on_cuda(monkeypatch):
    """On the GPU, with the target's forwards, the fused draft step and the bookkeeping all graphed."""
    rounds = round_reads(monkeypatch, "flashmap-fused", "cuda")
    assert len(rounds) >= 3 and all(sites == ["speculate.py:static_round"] for sites in rounds), rounds


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["none", "flashmap-fused", "dflash"])
def test_bookkeeping_graph_replays_are_plain_greedy_on_cuda(kind, monkeypatch):
    """An fp32 target on the GPU (the FlashMap drafter bf16: its fused kernels, "counted" mode): generate with
    cuda_graphs (the target's forwards and the round's bookkeeping captured, then replayed) gives plain greedy
    decoding (HF on the CPU) and the eager rounds over the same static numerics (chain_round on a StaticTarget
    without graphs); the bookkeeping graph of the full k was captured; a second call captures its own."""
    ref = greedy_continuation(tiny_model("qwen3"), IDS, 40).tolist()
    model = tiny_model("qwen3").to("cuda")
    drafter = {"none": None, "flashmap-fused": fused_flashmap, "dflash": dflash}[kind]
    drafter = drafter and drafter(model)
    made = commits(monkeypatch)
    eager = generate(StaticTarget(model, capacity=256), drafter, IDS, 40)
    target = Target(model)
    graphed = generate(target, drafter, IDS, 40, cuda_graphs=True)
    assert graphed.tokens == eager.tokens == ref
    k = 0 if drafter is None else drafter.num_draft_tokens
    assert made[0].mode == {"none": "none", "flashmap-fused": "counted", "dflash": "block"}[kind]
    assert isinstance(made[0]._graphs.get(k), tuple), made[0]._graphs  # captured, then replayed
    assert generate(target, drafter, IDS, 40, cuda_graphs=True).tokens == ref
    assert isinstance(made[1]._graphs.get(k), tuple)
