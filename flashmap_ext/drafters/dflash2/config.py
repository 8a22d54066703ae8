"""DFlash2 drafter configuration: DFlash's (dflash/config.py) plus the dynamic convolutions and the
candidate selector, in z-lab's released layout and in `speculators`' layout (speculators_format.py).

z-lab layout (`architectures: ["DFlash2DraftModel"]`): DFlash's `config.json` with `dflash_config.{
conv_kernel_size, conv_group_size, selector_rank, selector_top_k}` (fields read from `dflash_config` first,
then the top level, as DFlash's). Ours: `dflash_config.window_from_anchor` (written only when true), the
sliding-window rule of `speculators`' DFlash2: a sliding layer's block reads the context positions
[anchor − W, anchor) whichever slot asks (z-lab's rule counts the window back from each query).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from flashmap_ext.drafters.common.config import check_field_types
from flashmap_ext.drafters.dflash.config import DFlashConfig

ARCHITECTURE = "DFlash2DraftModel"
# the fields of a DFlash2 config beyond DFlash's, with the reference's defaults
DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
_SCHEMA = {**{name: "int" for name in DEFAULTS}, "window_from_anchor": "bool"}


@dataclass
class DFlash2Config(DFlashConfig):
    """Shapes of a DFlash2 drafter. conv_kernel_size: taps of each dynamic convolution (causal inside the
    block); conv_group_size: channels sharing one dynamic kernel value; selector_rank: rank of the
    bilinear transition term; selector_top_k: unary candidates the selector re-scores per slot."""
    conv_kernel_size: int = DEFAULTS["conv_kernel_size"]
    conv_group_size: int = DEFAULTS["conv_group_size"]
    selector_rank: int = DEFAULTS["selector_rank"]
    selector_top_k: int = DEFAULTS["selector_top_k"]
    window_from_anchor: bool = False

    architecture: ClassVar[str] = ARCHITECTURE
    draft_fields: ClassVar[tuple[str, ...]] = (*DEFAULTS, "window_from_anchor")

    def __post_init__(self):
        super().__post_init__()
        for name in DEFAULTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size}")
        if self.conv_kernel_size > self.block_size:
            raise ValueError(f"conv_kernel_size {self.conv_kernel_size} cannot exceed block_size {self.block_size}")
        rows = self.draft_vocab_size or self.vocab_size
        if self.selector_top_k > rows:
            raise ValueError(f"selector_top_k {self.selector_top_k} exceeds the draft vocabulary ({rows} rows)")

    @property
    def num_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    @property
    def selector_rows(self) -> int:
        """Rows of each selector codebook: the draft vocabulary's (the full vocabulary without one)."""
        return self.draft_vocab_size or self.vocab_size

    def to_hf_dict(self) -> dict[str, Any]:
        out = super().to_hf_dict()
        if not self.window_from_anchor:
            del out["dflash_config"]["window_from_anchor"]
        return out

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "DFlash2Config":
        """Parses z-lab's DFlash2 `config.json`: DFlash's fields (DFlashConfig.hf_fields; what cannot run is
        refused naming the field) and the DFlash2 fields, defaults as the reference's."""
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            raise ValueError(f"not a DFlash2 checkpoint: architectures={cfg.get('architectures')}")
        draft = cfg.get("dflash_config") or {}
        check_field_types(cfg, _SCHEMA)
        check_field_types(draft, _SCHEMA, "dflash_config.")
        fields = cls.hf_fields(cfg, allowed=frozenset({"conv_kernel_size", "selector_rank"}))
        for name, default in {**DEFAULTS, "window_from_anchor": False}.items():
            fields[name] = draft.get(name, cfg.get(name, default))
        return cls(**fields)
