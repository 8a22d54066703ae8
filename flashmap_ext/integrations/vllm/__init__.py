"""FlashMap in vLLM (`pip install flashmap[vllm]`): a `vllm.general_plugins` entry point and exporters.

    register()                the plugin: registers the FlashMap drafter architecture with vLLM's
                              ModelRegistry (vLLM calls it in every process through the entry point)
    export_dflash(src, dst)   our DFlash checkpoint -> a directory vLLM's native `dflash` method loads
    export_dflash2(src, dst)  our DFlash2 checkpoint -> z-lab's DFlash2 layout (vLLM >= 0.28.0 on GPU, `dflash`
                              method; vLLM's CPU build refuses DFlash2 drafters)
    export_flashmap(src, dst) our FlashMap checkpoint -> a directory served through the `dflash` method
                              by the plugin's drafter model (model.py)
    speculative_config(dst)  the `--speculative-config` dict for an exported directory

All exports are served with `method="dflash"`: vLLM's DFlash proposer precomputes the context K/V from
the target's tapped hidden states and runs the drafter once on [anchor, K query slots].
"""
from __future__ import annotations

from flashmap_ext.integrations.vllm.export import (
    ARCHITECTURE,
    export_dflash,
    export_dflash2,
    export_flashmap,
    speculative_config,
)

__all__ = ["register", "export_dflash", "export_dflash2", "export_flashmap", "speculative_config", "ARCHITECTURE"]


def register() -> None:
    """vLLM plugin entry point (`vllm.general_plugins`): registers ARCHITECTURE lazily (by module path,
    so importing the plugin does not import torch models or initialise a device)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "flashmap_ext.integrations.vllm.model:FlashMapDFlashForCausalLM")
