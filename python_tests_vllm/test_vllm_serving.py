"""vLLM (CPU build, fp32, T = 0) serving our drafters through its native `dflash` method.

Each configuration runs once in a subprocess (run_vllm.py: vLLM spawns and holds global state):
vLLM autoregressive, our DFlash checkpoint (export_dflash), and the FlashMap plugin (export_flashmap)
with 1 and 2 flow-map evaluations. Checks: vLLM AR == plain HF greedy; every speculative run ==
vLLM AR token for token; each prompt's tokens in the batch of 4 == its solo run; and every draft vLLM
proposed == what our own drafter drafts from the HF target on the same committed prefix.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models
import reference
from flashmap_ext.integrations.vllm import ARCHITECTURE, export_dflash, export_flashmap, speculative_config

HERE = Path(__file__).parent
SPEC_METHODS = ["dflash", "flashmap", "flashmap2"]
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_models")
    target = models.tiny_target(root / "target")
    drafters = {"dflash": models.tiny_dflash(target, root / "dflash_ours"),
                "flashmap": models.tiny_flashmap(target, root / "flashmap_ours", draft_steps=1),
                "flashmap2": models.tiny_flashmap(target, root / "flashmap2_ours", draft_steps=2)}
    export_dflash(root / "dflash_ours", root / "dflash")
    export_flashmap(root / "flashmap_ours", root / "flashmap", max_position_embeddings=512)
    export_flashmap(root / "flashmap2_ours", root / "flashmap2", max_position_embeddings=512)
    prompts = models.prompts()
    (root / "prompts.json").write_text(json.dumps(prompts))
    return {"root": root, "target": target, "drafters": drafters, "prompts": prompts}


_RUNS: dict[str, dict] = {}


def run(assets, method: str) -> dict:
    """vLLM's results for `method` ("ar" or one of SPEC_METHODS), computed once per session."""
    if method not in _RUNS:
        root = assets["root"]
        out = root / f"{method}.json"
        cmd = [sys.executable, str(HERE / "run_vllm.py"), str(root / "target"), str(root / "prompts.json"), str(out)]
        if method != "ar":
            cmd.append(json.dumps(speculative_config(root / method)))
        proc = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"vLLM run {method} failed:\n{proc.stderr[-6000:]}"
        _RUNS[method] = json.loads(out.read_text())
    return _RUNS[method]


def test_vllm_ar_is_plain_greedy(assets):
    ar = run(assets, "ar")
    for prompt, tokens in zip(assets["prompts"], ar["solo"]):
        assert tokens == reference.hf_greedy(assets["target"], prompt, len(tokens))


@pytest.mark.parametrize("method", ["ar"] + SPEC_METHODS)
def test_batch_of_four_equals_solo_runs(assets, method):
    result = run(assets, method)
    assert [len(p) for p in assets["prompts"]] == list(models.PROMPT_LENGTHS)
    assert result["batch"] == result["solo"]


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_speculative_tokens_equal_vllm_ar(assets, method):
    ar, spec = run(assets, "ar"), run(assets, method)
    assert spec["solo"] == ar["solo"]
    assert spec["batch"] == ar["batch"]


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_vllm_drafts_are_our_drafters(assets, method):
    """vLLM proposed exactly what our drafter (loaded from the same weights) drafts on each prefix."""
    result, drafter = run(assets, method), assets["drafters"][method]
    k = speculative_config(assets["root"] / method)["num_speculative_tokens"]
    compared = 0
    for prompt, output, proposals in zip(assets["prompts"], result["solo"], result["proposals"]):
        for context, anchor, drafts in reference.replay(prompt, output, proposals, k):
            assert drafts == reference.our_drafts(assets["target"], drafter, context, anchor, k), \
                f"{method}: drafts differ at position {len(context)}"
            compared += 1
    assert compared >= sum(len(o) for o in result["solo"]) // (k + 1)


def test_plugin_registers_the_flashmap_architecture():
    from importlib.metadata import entry_points

    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("flashmap") == "flashmap_ext.integrations.vllm:register"
    load_general_plugins()
    assert ARCHITECTURE in ModelRegistry.get_supported_archs()


def test_speculative_config_counts_drafted_slots(assets):
    root = assets["root"]
    assert speculative_config(root / "dflash")["num_speculative_tokens"] == 3  # block 4 = anchor + 3 masks
    assert speculative_config(root / "flashmap")["num_speculative_tokens"] == 3  # block_size 3: all slots draft


def test_export_dflash_keeps_the_weights_and_config(assets, tmp_path):
    from flashmap_ext import DFlashDrafter
    ours = assets["drafters"]["dflash"]
    loaded = DFlashDrafter.from_pretrained(assets["root"] / "dflash", assets["target"])
    assert loaded.config == ours.config
    for name, tensor in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(ValueError, match="not a DFlash checkpoint"):
        export_dflash(tmp_path / "bad", tmp_path / "out")


def test_export_flashmap_config_shapes_the_paged_cache(assets):
    raw = json.loads((assets["root"] / "flashmap" / "config.json").read_text())
    c = assets["drafters"]["flashmap"].config
    assert raw["architectures"] == [ARCHITECTURE] and raw["model_type"] == "qwen3"
    assert (raw["hidden_size"], raw["num_key_value_heads"], raw["head_dim"]) == (c.width, c.heads, c.head_dim)
    assert raw["dflash_config"]["target_layer_ids"] == list(c.target_layer_ids)
    assert raw["flashmap_config"]["draft_steps"] == 1
