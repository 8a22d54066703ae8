"""vLLM (CPU build, fp32, T = 0) serving our drafters through its native `dflash` method.

Each configuration runs once in a subprocess (run_vllm.py: vLLM spawns and holds global state):
vLLM autoregressive, our DFlash checkpoint with a draft vocabulary (export_dflash), and the FlashMap
plugin (export_flashmap) with 1 flow-map evaluation, and with 2 and a draft vocabulary. Checks: vLLM AR == plain HF greedy; every speculative run ==
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
                "flashmap2": models.tiny_flashmap(target, root / "flashmap2_ours", draft_steps=2,
                                                  with_draft_vocab=True)}
    export_dflash(root / "dflash_ours", root / "dflash", target=target)
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
        proc = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=1800)
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


def test_export_dflash_keeps_the_weights_and_adds_the_draft_head(assets, tmp_path):
    from safetensors.torch import load_file

    from flashmap_ext.drafters.dflash_config import DFlashConfig
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


def readme_python_block() -> str:
    """The Python block of README.md's "Serving with vLLM" section."""
    text = (HERE.parent / "README.md").read_text()
    section = text[text.index("## Serving with vLLM"):]
    return section[section.index("```python\n") + 10:section.index("\n```", section.index("```python"))]


def test_readme_python_api_runs_verbatim(assets, tmp_path):
    """The README block, with only its inputs line pointed at the tiny target and FlashMap drafter,
    generates vLLM's AR tokens (engine in-process, as the other runs: on this 2-core machine vLLM's
    engine and worker processes did not finish starting within 15 minutes under a load of ~20)."""
    lines = readme_python_block().splitlines()
    inputs = [i for i, line in enumerate(lines) if "target_dir, drafter_dir, prompts =" in line]
    assert len(inputs) == 1
    root, prompt = assets["root"], assets["prompts"][0]
    indent = lines[inputs[0]][:len(lines[inputs[0]]) - len(lines[inputs[0]].lstrip())]
    lines[inputs[0]] = (f"{indent}target_dir, drafter_dir, prompts = {str(root / 'target')!r}, "
                        f"{str(root / 'flashmap_ours')!r}, [{models.as_text(prompt)!r}]")
    lines.append(f"{indent}open('tokens.json', 'w').write(str(list(outputs[0].outputs[0].token_ids)))")
    (tmp_path / "readme.py").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "readme.py"], cwd=tmp_path, env={**os.environ, **ENV},
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    tokens = json.loads((tmp_path / "tokens.json").read_text())
    ar = run(assets, "ar")["solo"][0]
    assert len(tokens) == 64 and tokens[:len(ar)] == ar
