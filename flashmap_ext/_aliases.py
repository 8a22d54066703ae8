"""Old module paths (before the package restructure), kept as aliases for one release (README "Layout").

`import flashmap_ext.drafters.flashmap_fused` returns the module `flashmap_ext.drafters.flashmap.fused`
itself (not a copy), so patching an attribute through either name patches both.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module (relative to flashmap_ext) -> the module it now is
ALIASES = {
    "drafters.base": "drafters.common.base",
    "drafters.layers": "drafters.common.layers",
    "drafters.kv_cache": "drafters.common.kv_cache",
    "drafters.hf_checkpoint": "drafters.common.checkpoint",
    "drafters.flashmap_config": "drafters.flashmap.config",
    "drafters.flashmap_layers": "drafters.flashmap.block",
    "drafters.flashmap_memory": "drafters.flashmap.memory",
    "drafters.flashmap_draft": "drafters.flashmap.draft",
    "drafters.flashmap_fused": "drafters.flashmap.fused",
    "flow": "drafters.flashmap.flow",
    "drafters.dflash_config": "drafters.dflash.config",
    "drafters.dflash_blocks": "drafters.dflash.blocks",
    "drafters.eagle3_config": "drafters.eagle3.config",
    "drafters.eagle3_tree": "drafters.eagle3.tree",
    "drafters.eagle3_ttt": "drafters.eagle3.ttt",
    "dit_ops": "ops.dit",
    "reference": "ops.verify_reference",
    "reference_dit": "ops.dit_reference",
    "loop": "request",
    "drafters.eagle3_formats": "drafters.eagle3.formats",
    "cost_calibrate": "bench.calibrate",
    "data.store": "train.store",
    "train.loop": "train.trainer",
    "bench.assets": "assets.models",
    "bench.datasets": "assets.datasets",
    "bench.sharegpt": "assets.sharegpt",
    "drafters.target_parts": "target.tables",
    "drafters.flashmap_target": "target.tables",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.removeprefix("flashmap_ext.") in ALIASES and fullname.startswith("flashmap_ext."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module("flashmap_ext." + ALIASES[spec.name.removeprefix("flashmap_ext.")])

    def exec_module(self, module):
        pass  # the target module is already executed


def install() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
