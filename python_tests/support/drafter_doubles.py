"""Test drafters implementing drafters/base.py::BlockDrafter with known acceptance behaviour.

- OracleDrafter: proposes the target's own greedy continuation, computed by plain full-recompute greedy
  decoding of the HF model on a copy of the context (so at T = 0 every slot is accepted).
- ScheduledRejectDrafter: the oracle's proposal with slot j corrupted, j taken in turn from a schedule
  (j = K means no corruption), so a round accepts exactly j drafts; j = 0 always is "always wrong".
- RandomDrafter: uniform random ids keyed by (seed, position), sometimes -1 or >= V (invalid slots).
- OracleTreeDrafter (tree rounds): the greedy continuation as one branch, each true node preceded by a
  wrong sibling, optionally with the true token at one depth replaced (the accepted path stops there).

Every double records its memory: the committed token ids and taps it was given, so tests can check the
loop's memory contract (memory = all committed tokens except the anchor, taps = HF hidden_states[i + 1]).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch


@dataclass
class Memory:
    token_ids: list = field(default_factory=list)   # committed ids, in order
    taps: list = field(default_factory=list)        # [1, T, n * d] chunks
    calls: int = 0                                  # draft calls so far (this generate call only)


class RecordingDrafter:
    """Base: keeps the memory contract; `last_memory` is the memory of the latest generate call."""

    def __init__(self, num_draft_tokens: int, target_layer_ids=(0, 1)):
        self.num_draft_tokens = num_draft_tokens
        self.target_layer_ids = tuple(target_layer_ids)
        self.last_memory = None

    def new_memory(self, batch_size, device):
        assert batch_size == 1
        self.last_memory = Memory()
        return self.last_memory

    def extend_memory(self, memory, token_ids, taps):
        assert token_ids.dim() == 2 and token_ids.shape[0] == 1
        memory.token_ids.extend(token_ids[0].tolist())
        if taps is not None:
            assert taps.shape[:2] == token_ids.shape
            memory.taps.append(taps.clone())

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        assert num_tokens <= self.num_draft_tokens
        assert int(position[0]) == len(memory.token_ids), "position must be the anchor's absolute position"
        memory.calls += 1
        return self.propose(memory, int(anchor_tokens[0]), num_tokens, int(seed[0]), int(position[0]))


class OracleDrafter(RecordingDrafter):
    def __init__(self, model, num_draft_tokens: int, target_layer_ids=(0, 1)):
        super().__init__(num_draft_tokens, target_layer_ids)
        self.model = model

    def propose(self, memory, anchor, k, seed, position):
        return greedy_continuation(self.model, memory.token_ids + [anchor], k)[None]


class ScheduledRejectDrafter(OracleDrafter):
    def __init__(self, model, num_draft_tokens: int, schedule, target_layer_ids=(0, 1)):
        super().__init__(model, num_draft_tokens, target_layer_ids)
        self.schedule = list(schedule)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    def reject_slot(self, call: int) -> int:
        return self.schedule[(call - 1) % len(self.schedule)]

    def propose(self, memory, anchor, k, seed, position):
        drafts = super().propose(memory, anchor, k, seed, position)
        j = self.reject_slot(memory.calls)
        if j < k:
            drafts[0, j] = (drafts[0, j] + 1) % self.vocab_size
        return drafts


class RandomDrafter(RecordingDrafter):
    def __init__(self, vocab_size: int, num_draft_tokens: int, target_layer_ids=(0, 1), invalid=True):
        super().__init__(num_draft_tokens, target_layer_ids)
        self.vocab_size, self.invalid = vocab_size, invalid

    def propose(self, memory, anchor, k, seed, position):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + position)
        lo, hi = (-1, self.vocab_size + 2) if self.invalid else (0, self.vocab_size)
        return torch.randint(lo, hi, (1, k), generator=gen)


class OracleTreeDrafter:
    """`draft_tree` for `speculate.generate(..., tree=...)`: a depth-`depth` tree holding the target's greedy
    continuation as one branch, each true node preceded by a wrong sibling ((tok + 7) % V); with
    `wrong_depth` the true token at that depth is replaced by (tok + 1) % V."""
    target_layer_ids = (1, 2)

    def __init__(self, model, vocab_size: int, wrong_depth=None):
        self.model, self.vocab_size, self.wrong_depth = model, vocab_size, wrong_depth
        self.depths: list = []   # the depth asked for in each draft_tree call

    def new_memory(self, batch_size, device):
        return []

    def extend_memory(self, memory, token_ids, taps):
        assert taps.shape[:2] == token_ids.shape
        memory.extend(token_ids[0].tolist())

    def draft_tree(self, memory, anchor, position, *, depth, topk, num_nodes):
        from flashmap_ext.drafters.eagle3.tree import DraftTree
        assert len(memory) == int(position), "memory must hold every committed token except the anchor"
        self.depths.append(depth)
        truth, V = greedy_continuation(self.model, memory + [int(anchor)], depth).tolist(), self.vocab_size
        tokens, parents, parent = [], [], -1
        for d, tok in enumerate(truth, start=1):
            tok = (tok + 1) % V if d == self.wrong_depth else tok
            tokens += [(tok + 7) % V, tok]
            parents += [parent, parent]
            parent = len(tokens) - 1
        n = len(tokens)
        return DraftTree(torch.tensor(tokens), torch.tensor(parents),
                         torch.tensor([i // 2 + 1 for i in range(n)]), torch.zeros(n))


# model -> {context tuple: continuation list}, full-recompute greedy results; weak keys, so that a new model
# that reuses a freed model's id() never finds that model's continuations
_GREEDY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def greedy_continuation(model, context: list, n: int) -> torch.Tensor:
    """[n] int64: plain greedy decoding with a full recompute per token (no KV cache).

    Memoised per model: a context that extends a known one along its greedy path reuses it (greedy
    decoding is a deterministic function of the full context), so oracles stay cheap in tests.
    """
    known = _GREEDY.setdefault(model, {})
    context = tuple(int(t) for t in context)
    for ctx, cont in known.items():
        m = len(context) - len(ctx)
        if 0 <= m <= len(cont) - n and context[:len(ctx)] == ctx and context[len(ctx):] == tuple(cont[:m]):
            return torch.tensor(cont[m:m + n], dtype=torch.int64)
    known[context] = _greedy(model, context, n + 8)
    return torch.tensor(known[context][:n], dtype=torch.int64)


@torch.no_grad()
def _greedy(model, context: tuple, n: int) -> list:
    ids = torch.tensor([context], dtype=torch.int64)
    out = []
    for _ in range(n):
        nxt = model(input_ids=ids).logits[0, -1].argmax()
        out.append(int(nxt))
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out


def random_flashmap(model, k: int, taps, **fields):
    """A FlashMap drafter with random (not adaLN-zero) weights, so its drafts depend on the context;
    `fields`: more FlashMapConfig fields (e.g. joint_attention=True)."""
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    torch.manual_seed(1)
    drafter = FlashMapDrafter.for_target(model, **{"n_layers": 2, "width": 64, "heads": 4, **fields}, block_size=k,
                                         target_layer_ids=taps)
    drafter.reset_parameters(zero_init=False)
    return drafter


def assert_inference_matches_training(drafter, tau: torch.Tensor) -> None:
    """A FlashMap drafter's training forward (blocks at anchors [[0, 4, 8], [3, 7, 1]] of two 9-token rows, 2 taps of
    a 64-wide target, K = 4) against its inference path, one block at a time from a memory of the committed
    prefix; tau [2, 3] the blocks' τ_s = τ_t."""
    taps = torch.randn(2, 9, 2 * 64, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 111, (2, 9))
    anchor_pos = torch.tensor([[0, 4, 8], [3, 7, 1]])
    z = torch.randn(2, 3, 4, 64)
    train = drafter.forward_train(taps, ids, anchor_pos, z, tau, tau)
    for b in range(2):
        for a, p in enumerate(anchor_pos[b].tolist()):
            memory = drafter.new_memory(1)
            if p:
                drafter.extend_memory(memory, ids[b:b + 1, :p], taps[b:b + 1, :p])
            ref = drafter.denoise(memory, ids[b, p:p + 1], z[b, a:a + 1], tau[b, a:a + 1], tau[b, a:a + 1])
            torch.testing.assert_close(train[b, a], ref[0], atol=1e-5, rtol=1e-5)
