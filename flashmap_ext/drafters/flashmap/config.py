"""FlashMapConfig: the shape of a FlashMap drafter (DESIGN.md §5), stored as `config.json` in checkpoints."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashmap_ext.drafters.common.config import check_field_types
from flashmap_ext.drafters.common.window import check_window
from flashmap_ext.drafters.flashmap.flow import Clock, full_state_clock, table_clock

MODEL_TYPE = "flashmap_drafter"
#: the trunk kinds (`FlashMapConfig.trunk`)
TRUNKS = ("dit", "qwen3")
FORMAT_VERSION = 1


@dataclass
class FlashMapConfig:
    """Defaults reproduce the paper's Qwen3-8B drafter (≈0.5 B trainable parameters).

    n_layers, width, heads, mlp_ratio: the DiT trunk (DESIGN.md §5.2). width % heads == 0, head dim even.
    block_size: K, draft slots per block (all K are proposals; the anchor is not a slot).
    cond_dim: width of the time conditioning c = SiLU(Emb_s(τ_s) + Emb_t(τ_t)).
    target_layer_ids: 0-based target decoder layers whose outputs are tapped (HF hidden_states[i + 1]).
    d_target, vocab_size: the target's hidden size and (padded) vocabulary rows.
    draft_steps: network evaluations per drafted block by default (1 or 2, DESIGN.md §4).
    draft_draws: noise draws per drafted block; above 1 the block the drafter rates best is kept
        (drafters/flashmap/mode.py; draft_draws × draft_steps evaluations).
    softcap: tanh soft cap on the logits (FMLM uses 30); 0 disables it.
    draft_vocab_size: optional EAGLE-3-style draft vocabulary (the flow lives on these rows only; the
        `d2t` buffer maps draft id i to target id i + d2t[i]). None: the full vocabulary.
    two_time: True for a flow map δ(x, τ_s, τ_t) (distilled drafter); False for a flow model D(x, τ)
        (the flow stage and the distillation teacher): τ_t is ignored and there is no second embedder.
    time_scale: τ is multiplied by this before the sinusoidal embedding.
    rope_theta: RoPE base of the attention over memory entries and slots (absolute positions): the
        cross-attention of the DiT trunk, the one attention of the qwen3 trunk (`train flow --trunk qwen3` sets it to the target's).
    context_window: W, the drafter reads at most the last W memory entries (committed positions) plus
        its anchor, in training and at inference (common/window.py, DESIGN.md §5.6); None: all of them.
    tap_input_norm: divide each tapped layer's d_target vector by its RMS before the tap projection
        (x / sqrt(mean(x²) + norm_eps), no gain: the projection right after it holds any per-channel
        scale). The target's tap norms grow ~10x from the first to the last taps; without this
        the projection sees mostly the late layers. False (the default) for checkpoints made before it.
    clock_t, clock_tau: the τ↔t table of the "projected" clock (flow.projected_clock_table: τ is the
        fraction of decoding errors the exact reader of the network's d-dim input removes; built once from
        the state embedding by `FlashMapDrafter.calibrate_clock`). None (checkpoints made before it): the
        "full-state" clock of FLM, argmax decoding of the V-dim state, which that input cannot show
        (DESIGN.md §4).
    state_loglik: add the exact log-likelihood of the slot's input state under each token,
        `flow.reader_log_likelihood` at t(τ_s), to the logits (the network then predicts the context's
        part of the posterior). False for checkpoints made before it.
    joint_attention: each block has one attention whose keys are the memory entries and the block's own
        slots (DFlash's layout, `block.JointAttention`) in place of slot self-attention + memory
        cross-attention; its adaLN then makes 6 modulations, not 9. Reference (PyTorch) path only: the
        fused CUDA kernels and the vLLM export refuse it. False for checkpoints made before it.
    tau_gated_input: the slot tokens take the normed state projection times τ_s, so at τ = 0 (a one-step
        draft) a slot holds only its position embedding, as DFlash's mask tokens do, and the draft does not
        depend on the noise; at τ_s > 0 the state enters scaled by τ_s. Reference (PyTorch) path only: the
        fused CUDA kernels and the vLLM export refuse it. False for checkpoints made before it.
    memory_width: width of the memory entries (the tap and anchor projections' output) from which each
        block's memory keys and values are projected; None (the default, and checkpoints made before it):
        `width`. DFlash's memory entries have the target's hidden size. Not with joint_attention (whose
        slots share the memory's K/V projections). Reference (PyTorch) path only unless equal to width:
        the fused CUDA kernels and the vLLM export refuse it.
    head_mlp: hidden units of a residual MLP at the target's width after the final Linear(width -> d_target),
        so the hidden state the LM head reads is not confined to a width-dim subspace (DFlash's is the full
        d_target); None (the default, and checkpoints made before it): no such MLP. Reference (PyTorch)
        path only: the fused CUDA kernels and the vLLM export refuse it.
    trunk: "dit" (the default, and checkpoints made before it): adaLN-Zero DiT blocks (`block.DiTBlock`).
        "qwen3": DFlash's layer (`qwen_block.QwenBlock`: pre-norm, one grouped-query attention over the
        memory entries and the block's own slots, SwiGLU MLP of round(width·mlp_ratio) units) at
        width = d_target, the time conditioning added to the slot tokens once (`time_in`), and the final
        RMSNorm feeding the LM head directly. Not with memory_width, head_mlp or joint_attention (its
        attention is joint already). Reference (PyTorch) path only: the fused CUDA kernels and the vLLM
        export refuse it.
    kv_heads: key/value heads of the "qwen3" trunk's attention (grouped-query; must divide heads); None:
        `heads`. Only with trunk "qwen3".
    """
    n_layers: int = 6
    width: int = 2048
    heads: int = 16
    mlp_ratio: float = 4.0
    block_size: int = 16
    cond_dim: int = 256
    target_layer_ids: tuple[int, ...] = field(default=(1, 9, 17, 25, 33))
    d_target: int = 4096
    vocab_size: int = 151_936
    draft_steps: int = 1
    draft_draws: int = 1
    softcap: float = 30.0
    draft_vocab_size: int | None = None
    two_time: bool = True
    time_scale: float = 1000.0
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    context_window: int | None = None
    tap_input_norm: bool = False
    clock_t: tuple[float, ...] | None = None
    clock_tau: tuple[float, ...] | None = None
    state_loglik: bool = False
    joint_attention: bool = False
    tau_gated_input: bool = False
    memory_width: int | None = None
    head_mlp: int | None = None
    trunk: str = "dit"
    kv_heads: int | None = None

    def __post_init__(self):
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)
        check_window(self.context_window)
        if (self.clock_t is None) != (self.clock_tau is None):
            raise ValueError("FlashMapConfig: clock_t and clock_tau must be given together (or neither)")
        if self.clock_t is not None:
            self.clock_t, self.clock_tau = (tuple(float(x) for x in v) for v in (self.clock_t, self.clock_tau))
            table_clock(self.clock_t, self.clock_tau)  # ValueError for a malformed table
        checks = [
            ("n_layers", self.n_layers >= 1, ">= 1"), ("block_size", self.block_size >= 1, ">= 1"),
            ("width", self.width >= 1, ">= 1"),
            ("heads", self.heads >= 1 and self.width % self.heads == 0 and (self.width // self.heads) % 2 == 0,
             f"must divide width={self.width} into heads of an even dimension"),
            ("target_layer_ids", len(self.target_layer_ids) >= 1 and min(self.target_layer_ids) >= 0,
             "one or more layer indices >= 0"),
            ("draft_steps", self.draft_steps in (1, 2), "1 or 2"), ("draft_draws", self.draft_draws >= 1, ">= 1"),
            ("softcap", self.softcap >= 0, ">= 0"),
            ("vocab_size", self.vocab_size >= 2, ">= 2"), ("d_target", self.d_target >= 1, ">= 1"),
            ("draft_vocab_size", self.draft_vocab_size is None or 2 <= self.draft_vocab_size <= self.vocab_size,
             f"None or in [2, vocab_size={self.vocab_size}]"),
            ("memory_width", self.memory_width is None or (type(self.memory_width) is int and self.memory_width >= 1),
             "None or an int >= 1"),
            ("head_mlp", self.head_mlp is None or (type(self.head_mlp) is int and self.head_mlp >= 1),
             "None or an int >= 1"),
            ("memory_width", not (self.joint_attention and self.memory_entry_width != self.width),
             f"None or width={self.width} with joint_attention: its slots share the memory's K/V projections"),
            ("trunk", self.trunk in TRUNKS, f"one of {', '.join(TRUNKS)}"),
            ("kv_heads", self.kv_heads is None or (type(self.kv_heads) is int and self.kv_heads >= 1
                                                   and self.heads % self.kv_heads == 0),
             f"None or an int >= 1 dividing heads={self.heads}"),
            *self._qwen3_checks(),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"FlashMapConfig: invalid {name}={getattr(self, name)!r} (expected {rule})")

    def _qwen3_checks(self) -> list[tuple[str, bool, str]]:
        """(field, ok, rule) of the fields the trunk choice constrains."""
        if self.trunk != "qwen3":
            return [("kv_heads", self.kv_heads is None, 'None unless trunk="qwen3"')]
        return [("width", self.width == self.d_target,
                 f'd_target={self.d_target} with trunk="qwen3" (the LM head reads its final state)'),
                ("memory_width", self.memory_width is None, 'None with trunk="qwen3"'),
                ("head_mlp", self.head_mlp is None, 'None with trunk="qwen3" (its state is d_target wide)'),
                ("joint_attention", not self.joint_attention,
                 'False with trunk="qwen3" (its one attention reads memory and slots already)'),
                ("mlp_ratio", self.mlp_hidden >= 1, "a ratio leaving >= 1 MLP unit")]

    @property
    def memory_heads(self) -> int:
        """Heads of the memory's keys/values: `kv_heads` (qwen3 trunk), else `heads`."""
        return self.kv_heads or self.heads

    @property
    def mlp_hidden(self) -> int:
        """The qwen3 trunk's SwiGLU units: round(width · mlp_ratio)."""
        return round(self.width * self.mlp_ratio)

    @property
    def memory_entry_width(self) -> int:
        """The memory entries' width: `memory_width`, or `width` when it is None."""
        return self.width if self.memory_width is None else self.memory_width

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def clock(self) -> Clock:
        """The τ↔t clock: the stored "projected" table, else the "full-state" clock of V_s rows."""
        if self.clock_t is None:
            return full_state_clock(self.state_vocab_size)
        return table_clock(self.clock_t, self.clock_tau)

    @property
    def state_vocab_size(self) -> int:
        """Rows of the flow's state space: the draft vocabulary if any, else the full vocabulary."""
        return self.draft_vocab_size or self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": MODEL_TYPE, "format_version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FlashMapConfig":
        """A checkpoint's config (`to_dict` output). ValueError naming the field for another model_type,
        unknown or missing fields (every field but the optional ones, `OPTIONAL_FIELDS`, must be there:
        nothing else is defaulted) or a value of the wrong JSON type; NotImplementedError for a `format_version`
        other than FORMAT_VERSION."""
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"not a FlashMap drafter config: model_type={d.get('model_type')!r}")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
                raise NotImplementedError(f"format_version {version} is newer than this flashmap_ext reads "
                                          f"({FORMAT_VERSION}): upgrade flashmap_ext")
            raise ValueError(f"field format_version: expected {FORMAT_VERSION}, got {version!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"model_type", "format_version"}
        if unknown:
            raise ValueError(f"unknown FlashMapConfig fields: {sorted(unknown)}")
        missing = sorted(names - set(d) - OPTIONAL_FIELDS)
        if missing:
            raise ValueError(f"missing field{'s' * (len(missing) > 1)} {', '.join(missing)} (a FlashMap "
                             f"config.json lists every field; none is defaulted)")
        check_field_types(d, SCHEMA)
        return cls(**{k: v for k, v in d.items() if k in names})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FlashMapConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


#: Fields a format-1 config.json may leave out (added after format 1; absent = the earlier behaviour).
OPTIONAL_FIELDS = frozenset({"context_window", "tap_input_norm", "clock_t", "clock_tau", "state_loglik",
                             "draft_draws", "joint_attention", "tau_gated_input",
                             "memory_width", "head_mlp", "trunk", "kv_heads"})
_TYPES = {"str": "str", "int": "int", "float": "float", "bool": "bool", "tuple[int, ...]": "ints", "int | None": "int?",
          "tuple[float, ...] | None": "floats?"}
#: JSON type of every field (common.config.check_field_types), from the annotations above.
SCHEMA = {f.name: _TYPES[f.type] for f in dataclasses.fields(FlashMapConfig)}


#: Named drafter sizes (`FlashMapDrafter.for_target(target, "NAME")`, `flashmap train --preset NAME`):
#: the papers' Qwen3-8B drafter (≈0.5 B trainable parameters at d_target 4096) and two CPU-sized ones.
SHAPES: dict[str, dict[str, int]] = {
    "qwen3-8b": dict(n_layers=6, width=2048, heads=16, block_size=16),
    "cpu-small": dict(n_layers=2, width=512, heads=8, block_size=16),
    "cpu-tiny": dict(n_layers=2, width=128, heads=4, block_size=8),
}
#: The fields that size a drafter: `for_target` takes them all or a `SHAPES` name, never a guess.
SIZE_FIELDS = ("n_layers", "width", "heads")


def shape_fields(preset: str | None, fields: dict) -> dict:
    """`SHAPES[preset]` updated by `fields`; ValueError naming `preset` for an unknown name, or when there
    is no preset and `fields` lacks one of SIZE_FIELDS (the config defaults are the Qwen3-8B drafter's)."""
    if preset is not None:
        if preset not in SHAPES:
            raise ValueError(f"preset: expected one of {sorted(SHAPES)}, got {preset!r}")
        return {**SHAPES[preset], **fields}
    missing = [f for f in SIZE_FIELDS if f not in fields]
    if missing:
        raise ValueError(f"preset: pass a drafter size, a preset name ({', '.join(sorted(SHAPES))}) or all of "
                         f"{', '.join(SIZE_FIELDS)} (missing {', '.join(missing)}); nothing is guessed")
    return dict(fields)


def default_tap_layers(num_layers: int, n_taps: int = 5) -> tuple[int, ...]:
    """`n_taps` layer ids spread uniformly from 1 to L−3 (rounded, deduplicated, clamped to [0, L−1]).

    Qwen3-8B (L = 36): (1, 9, 17, 25, 33) as in DESIGN.md §5.1. A 4-layer target gives (1,).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    lo, hi = min(1, num_layers - 1), max(min(1, num_layers - 1), num_layers - 3)
    if n_taps == 1:
        return (lo,)
    ids = [round(lo + (hi - lo) * i / (n_taps - 1)) for i in range(n_taps)]
    return tuple(sorted(set(ids)))
