"""vLLM (CPU build, fp32, T = 0) serving our drafters through its native `dflash` method.

Each configuration runs once in a subprocess (conftest.run_vllm): vLLM autoregressive, our DFlash
checkpoint with a draft vocabulary (export_dflash), and the FlashMap plugin (export_flashmap) with 1
flow-map evaluation, and with 2 and a draft vocabulary. Checks: vLLM AR == plain HF greedy; every
speculative run == vLLM AR token for token; each prompt's tokens in the batch of 4 == its solo run; and
every draft vLLM proposed == what our own drafter drafts from the HF target on the same committed prefix.
"""
from __future__ import annotations

import json

import pytest
import torch

import models
import reference
from conftest import SPEC_METHODS
from conftest import run_vllm as run
from flashmap_ext.integrations.vllm import ARCHITECTURE, export_dflash, speculative_config


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


def test_export_dflash_keeps_the_weights_and_adds_the_draft_head(assets, tmp_path):
    from safetensors.torch import load_file

    from flashmap_ext.drafters.dflash.config import DFlashConfig
    ours, out = assets["drafters"]["dflash"], assets["root"] / "dflash"
    source = json.loads((assets["root"] / "dflash_ours" / "config.json").read_text())
    assert DFlashConfig.from_hf_dict(json.loads((out / "config.json").read_text())) == DFlashConfig.from_hf_dict(source)
    exported = load_file(out / "model.safetensors")
    assert set(exported) == set(ours.state_dict()) | {"lm_head.weight"}
    for name, tensor in ours.state_dict().items():
        assert torch.equal(exported[name], tensor), name
    rows = models.draft_vocab().sort().values  # the draft vocabulary, ascending: draft id i -> rows[i]
    assert torch.equal(exported["lm_head.weight"], assets["target"].lm_head.weight[rows])
    with pytest.raises(ValueError, match="target"):
        export_dflash(assets["root"] / "dflash_ours", tmp_path / "no_target")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(ValueError, match="not a DFlash checkpoint"):
        export_dflash(tmp_path / "bad", tmp_path / "out")
    (tmp_path / "capped").mkdir()
    capped = {**source, "dflash_config": {**source["dflash_config"], "final_logit_softcapping": 30.0}}
    (tmp_path / "capped" / "config.json").write_text(json.dumps(capped))
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        export_dflash(tmp_path / "capped", tmp_path / "out", target=assets["target"])


def test_export_flashmap_config_shapes_the_paged_cache(assets):
    raw = json.loads((assets["root"] / "flashmap" / "config.json").read_text())
    c = assets["drafters"]["flashmap"].config
    assert raw["architectures"] == [ARCHITECTURE] and raw["model_type"] == "qwen3"
    assert (raw["hidden_size"], raw["num_key_value_heads"], raw["head_dim"]) == (c.width, c.heads, c.head_dim)
    assert raw["dflash_config"]["target_layer_ids"] == list(c.target_layer_ids)
    assert raw["flashmap_config"]["draft_steps"] == 1
    assert json.loads((assets["root"] / "flashmap2" / "config.json").read_text())["flashmap_config"]["draft_steps"] == 2
