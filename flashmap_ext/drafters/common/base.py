"""The interface every drafter offers the decoding loop (speculate.generate, DESIGN.md §7).

Conventions shared by all drafters:
- `target_layer_ids` are 0-based indices of target decoder layers whose *outputs* are tapped (HF
  `hidden_states[i + 1]`, as DFlash's `target_layer_ids`; for the last layer that is the final norm's
  output, as in HF and z-lab's DFlash).
- "memory" is the drafter's incremental context cache (DESIGN.md §5.3). It holds one entry per committed
  position whose target KV is valid, i.e. every committed token except the current anchor.
- K = `num_draft_tokens`, the most drafts one call proposes (the verify block is anchor + K): FlashMap's
  `block_size`, DFlash's `block_size − 1` (its block counts the anchor), EAGLE-3's chain length.
  `flashmap_ext.draft_block` (drafters/drafting.py) is the one public drafting call over this protocol.
- Drafts never see the verifier's randomness: drafter noise comes from its own Philox stream keyed by
  (seed, position) (DESIGN.md §3.1).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

import torch

from flashmap_ext.checks import check_int, describe
from flashmap_ext.drafters.common.config import target_shape
from flashmap_ext.drafters.common.vocab import DraftVocab
from flashmap_ext.target.model import hf_causal_lm
from flashmap_ext.target.tables import TargetTables


@runtime_checkable
class BlockDrafter(Protocol):
    #: Maximum number of draft tokens proposed per round (the verify block is anchor + these).
    num_draft_tokens: int
    #: Target layers to tap (0-based decoder-layer outputs); empty if the drafter needs no features.
    target_layer_ids: Sequence[int]

    def new_memory(self, batch_size: int, device: torch.device) -> Any:
        """An empty context cache for `batch_size` sequences."""

    def extend_memory(self, memory: Any, token_ids: torch.Tensor, taps: torch.Tensor | None) -> None:
        """Appends committed positions to `memory` in place.

        token_ids: [B, T] int64, the committed tokens whose target KV is now valid.
        taps: [B, T, len(target_layer_ids) * d_target], the target's tapped hidden states at those
            positions concatenated in `target_layer_ids` order (None when `target_layer_ids` is empty).
        """

    def draft(self, memory: Any, anchor_tokens: torch.Tensor, *, num_tokens: int,
              seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Proposes `num_tokens` (<= num_draft_tokens) tokens following each anchor.

        anchor_tokens: [B] int64, the last committed token (not yet in memory).
        seed, position: [B] int64, the request seed and the absolute position of the anchor.
        Returns draft_tokens [B, num_tokens] int64 (-1 = no proposal for that slot and the rest).
        """


class DraftBlock(NamedTuple):
    """What `draft_block` returns for every drafter: tokens [B, K] int64 target ids (−1 = no proposal
    for that slot and the rest); logits [B, K, V_s] fp32 over the draft vocabulary's rows (the last
    network evaluation for FlashMap), or None."""
    tokens: torch.Tensor
    logits: torch.Tensor | None


def per_row(value: torch.Tensor | int, batch_size: int, device: torch.device,
            name: str = "seed/position") -> torch.Tensor:
    """A seed or position as [B] int64 on `device`: a tensor ([B] or [1]) is moved there (no copy when
    it already lives there), an int is filled in on the device (no host-to-device transfer).
    Raises ValueError naming `name` for a non-integer value or tensor, or one that is neither [B] nor [1]."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool \
                or value.numel() not in (1, batch_size) or value.dim() > 1:
            raise ValueError(f"{name}: expected an int or a [B={batch_size}] (or [1]) integer tensor, got "
                             f"{list(value.shape)} {value.dtype}")
        return value.to(device=device, dtype=torch.int64).reshape(-1).expand(batch_size)
    if isinstance(value, bool) or not hasattr(value, "__index__"):  # 10.0 or "10" would be taken as 10
        raise ValueError(f"{name}: expected an int or a [B={batch_size}] (or [1]) integer tensor, got "
                         f"{type(value).__name__} {value!r}")
    return torch.full((batch_size,), int(value), dtype=torch.int64, device=device)


def truncated(current: list, lengths) -> list:
    """`lengths` ([B] ints: a list or an integer tensor, a CUDA one copied to the host) as a list of ints,
    checked against the `current` row lengths: ValueError naming `lengths` unless each lies in
    [0, current[b]]."""
    if isinstance(lengths, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
        new = list(lengths)  # Python ints: no tensor round trip (the decoding loop's per-round call)
        if len(new) != len(current):
            raise ValueError(f"lengths: expected [B={len(current)}] integers, got {len(new)}")
    else:
        new = torch.as_tensor(lengths).reshape(-1).cpu()
        if new.is_floating_point() or new.dtype == torch.bool or new.numel() != len(current):
            raise ValueError(f"lengths: expected [B={len(current)}] integers, got {list(new.shape)} {new.dtype}")
        new = new.tolist()
    if any(not 0 <= n <= c for n, c in zip(new, current)):
        raise ValueError(f"lengths: each row's new length must lie in [0, its length]; got {new} for rows of "
                         f"{list(current)} (truncate cuts, extend_memory appends)")
    return new


class RaggedRows:
    """Mixin of the drafter memories: `rows`, the committed positions of each row as Python ints (no device
    sync; torch.compile sees constants), which may differ (a ragged batch)."""
    rows: list

    @property
    def lengths(self) -> torch.Tensor:
        """[B] int64 (CPU): committed positions per row = the absolute position of each row's anchor."""
        return torch.tensor(self.rows, dtype=torch.int64)

    def lengths_on(self, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """`lengths` as [B] `dtype` on `device`, without a host sync on CUDA: staged in pinned memory and
        copied asynchronously (the caching host allocator keeps the staging block until the copy has run,
        so a later call cannot overwrite it early). A pageable host-to-device copy would synchronise, which
        a CUDA-graph replay must not (python_tests/drafters/test_draft_graph.py)."""
        host = torch.tensor(self.rows, dtype=dtype)
        if torch.device(device).type != "cuda":
            return host.to(device)
        return host.pin_memory().to(device, non_blocking=True)

    @property
    def length(self) -> int:
        """The longest row's committed positions (the buffers' high-water mark); setting it sets every row's."""
        return max(self.rows, default=0)

    @length.setter
    def length(self, n: int) -> None:
        self.rows = [int(n)] * len(self.rows)

    @property
    def ragged(self) -> bool:
        """True when the rows hold different lengths."""
        return len(set(self.rows)) > 1

    def grow(self, n: int) -> None:
        """Counts n more committed positions in every row (after they were written)."""
        self.rows = [r + n for r in self.rows]

    def truncate(self, lengths) -> None:
        """Cuts row b back to its first lengths[b] positions ([B] ints, each <= the row's length; ValueError
        naming `lengths` otherwise): what a round keeps after `extend_memory` appended its whole block."""
        self.rows = truncated(self.rows, lengths)


class TargetMismatch(ValueError):
    """A drafter built for another target: a config field (hidden size, vocabulary, tap layers) does not
    match the target it is attached to; one line naming each mismatching field and both values."""


def config_fits(name: str, config: Any, shape: tuple[int, int], vocab_field: str, hidden_field: str) -> None:
    """TargetMismatch ("NAME built for another target: ...") naming each field of `config` (`vocab_field`:
    embedding rows, `hidden_field`: hidden size) that differs from the target's embedding `shape`; for
    checks that must run before a drafter exists (a checkpoint's head rows are gathered from the target)."""
    rows, hidden = shape
    pairs = [(hidden_field, hidden, "hidden size"), (vocab_field, rows, "vocabulary (embedding rows)")]
    wrong = [f"{field} {getattr(config, field)} != the target's {what} {value}"
             for field, value, what in pairs if getattr(config, field) != value]
    if wrong:
        raise TargetMismatch(f"{name} built for another target: {'; '.join(wrong)}")


class ReadsTarget:
    """Mixin of the drafters: the target's frozen tables they read (`attach_target` sets `_tables`) and
    their draft vocabulary (the buffer `d2t`, if any)."""
    _tables: TargetTables | None = None

    @property
    def tables(self) -> TargetTables:
        if self._tables is None:
            raise RuntimeError(f"{type(self).__name__}: no target attached: call attach_target(target) or pass "
                               "target= first")
        return self._tables

    #: the config fields that must equal the target's embedding rows and hidden size (`check_target`)
    target_fields: tuple[str, str] = ("vocab_size", "hidden_size")
    #: whether `config.target_layer_ids` must name layers the target has (`check_target`)
    checks_tap_layers: bool = True

    def check_target(self, target: Any) -> None:
        """TargetMismatch (one line naming each mismatching field and both values) unless this drafter was built
        for `target`'s shapes: what `attach_target` (so `from_pretrained`) and `generate` check."""
        self.check_fits(tuple(hf_causal_lm(target).get_input_embeddings().weight.shape), *self.target_fields)
        if self.checks_tap_layers:
            self.check_tap_layers(target)

    def check_fits(self, shape: tuple[int, int], vocab_field: str, hidden_field: str) -> None:
        """TargetMismatch naming each config field (`vocab_field`: embedding rows, `hidden_field`: hidden
        size) whose value differs from the target's embedding `shape` (rows, hidden)."""
        config_fits(type(self).__name__, self.config, shape, vocab_field, hidden_field)

    def check_tap_layers(self, target: Any) -> None:
        """TargetMismatch when `config.target_layer_ids` name a layer `target` does not have."""
        layers = target_shape(hf_causal_lm(target).config)["num_target_layers"]
        if max(self.config.target_layer_ids) >= layers:
            raise TargetMismatch(f"target_layer_ids {list(self.config.target_layer_ids)} outside the target's "
                                 f"{layers} layers")

    #: the projection whose weight dtype is the dtype new_memory makes entries in (None: no dtype to check)
    memory_proj: str | None = None

    @property
    def memory_dtype(self) -> torch.dtype | None:
        """The dtype new_memory makes entries in; a memory filled in another one is refused (no cast)."""
        return None if self.memory_proj is None else getattr(self, self.memory_proj).weight.dtype

    @property
    def vocab(self) -> DraftVocab:
        """The draft vocabulary (the full vocabulary without a `d2t` buffer)."""
        return DraftVocab(getattr(self, "d2t", None))


def host_readable(t: torch.Tensor) -> bool:
    """Whether an argument check may read `t`'s values: CPU tensors outside compilation (on CUDA a read is a host
    sync, so bad values are left to the kernels and the embedding lookup's assert)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_token_ids(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    """TypeError naming `name` for a tensor that does not hold integers, ValueError when an id lies outside
    [0, vocab_size) (the target's vocabulary). Values are read for CPU tensors only: on CUDA (no host sync)
    the embedding lookup asserts."""
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer token ids (int64), got {ids.dtype}")
    if host_readable(ids) and not bool(((ids >= 0) & (ids < vocab_size)).all()):
        raise ValueError(f"{name}: expected ids in [0, {vocab_size}) (the target's vocabulary), got "
                         f"{ids.reshape(-1).tolist()[:8]}")


def check_memory_ids(token_ids: Any, vocab_size: int) -> None:
    """`extend_memory`'s token_ids: ValueError naming `token_ids` unless a [B, T] tensor, then `check_token_ids`
    (integer ids in [0, vocab_size))."""
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 2:
        raise ValueError(f"token_ids: expected [B, T] int64 token ids, got {describe(token_ids)}")
    check_token_ids("token_ids", token_ids, vocab_size)


def own_memory(drafter: Any, memory: Any) -> Any:
    """Stamps a memory `drafter.new_memory` made with its maker (a weak reference): `check_memory_type` then
    refuses it for any other drafter, whose weights did not fill it."""
    memory.owner = weakref.ref(drafter)
    return memory


def _wraps(drafter: Any, owner: Any) -> bool:
    """Whether `drafter` is `owner` or a wrapper drafting through it (`.inner`, e.g. a tree or lookup drafter)."""
    while drafter is not None:
        if drafter is owner:
            return True
        drafter = getattr(drafter, "inner", None)
    return False


def check_memory_type(drafter: Any, memory: Any) -> None:
    """TypeError naming `memory` when it is not of the type `drafter.new_memory` makes (`drafter.memory_type`,
    where the drafter names one): e.g. a FlashMapMemory given to a DFlash drafter, or the reverse. ValueError
    when another drafter's new_memory made it (`own_memory`): its entries come from that drafter's weights; or
    when its dtype is not the drafter's `memory_dtype` (where it names one: DFlash, EAGLE-3)."""
    expected = getattr(drafter, "memory_type", None)
    if expected is not None and not isinstance(memory, expected):
        raise TypeError(f"memory: expected the {expected.__name__} of drafter.new_memory(B) (a "
                        f"{type(drafter).__name__}'s memory, filled by extend_memory), got {type(memory).__name__}")
    made, now = getattr(memory, "dtype", None), getattr(drafter, "memory_dtype", None)
    if made is not None and now is not None and made != now:
        raise ValueError(f"memory: filled in {made} while the {type(drafter).__name__} now runs in {now} "
                         "(moved with .to() since): make a new memory with new_memory(B) and extend_memory")
    owner = getattr(memory, "owner", None)
    if owner is not None and not _wraps(drafter, owner()) and not torch.compiler.is_compiling():
        maker = owner()
        who = ("a drafter that no longer exists" if maker is None else
               f"{'another' if type(maker) is type(drafter) else 'a'} {type(maker).__name__}")
        raise ValueError(f"memory: made by {who} (its new_memory), not by this {type(drafter).__name__}: its "
                         "entries come from that drafter's weights; use this drafter's new_memory(B), filled by "
                         "its extend_memory")


def check_anchors(anchor_pos: torch.Tensor, batch: int, length: int) -> None:
    """anchor_pos must be [B, A] int64 with entries in [0, T) or −1 (padding); ValueError otherwise."""
    if anchor_pos.dim() != 2 or anchor_pos.shape[0] != batch or anchor_pos.dtype != torch.long:
        raise ValueError(f"anchor_pos must be [B={batch}, A] int64, got {tuple(anchor_pos.shape)} {anchor_pos.dtype}")
    if anchor_pos.numel() and (anchor_pos.min() < -1 or anchor_pos.max() >= length):
        raise ValueError(f"anchor_pos entries must be in [0, T={length}) or -1 for padding")


@dataclass(frozen=True)
class TreeSpec:
    """Shape of the draft trees: `depth` levels, `topk` children per expanded node and frontier width,
    `num_nodes` nodes kept (the DFlash paper's EAGLE-3 comparison: 7, 10, 16)."""
    depth: int = 7
    topk: int = 10
    num_nodes: int = 16

    def __post_init__(self):
        for name in ("depth", "topk", "num_nodes"):
            check_int(f"TreeSpec: {name}", getattr(self, name), 1)
        if self.num_nodes < self.depth:  # a tree of n nodes is at most n deep: the deeper levels are wasted
            raise ValueError(f"TreeSpec: num_nodes must be >= depth (a tree of {self.num_nodes} nodes cannot be "
                             f"{self.depth} deep), got depth {self.depth}, num_nodes {self.num_nodes}")

    @classmethod
    def parse(cls, text: str) -> "TreeSpec":
        """'DEPTH,TOPK,NODES' (e.g. '7,10,16') → TreeSpec; ValueError otherwise."""
        parts = text.split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"tree spec must be DEPTH,TOPK,NODES (e.g. 7,10,16), got {text!r}")
        return cls(*(int(p) for p in parts))
