"""Our DFlash2 export (`export_dflash2`, z-lab's layout) against vLLM 0.32.0's DFlash2 drafter.

vLLM serves DFlash2 through its `dflash` method (`DFlash2DraftModel` -> `qwen3_dflash2.DFlash2Qwen3ForCausalLM`,
proposals by the Model Runner V2 `DFlash2Speculator`, whose selector walk is a Triton kernel). The CPU build
has no Triton CPU backend, so it runs Model Runner V1, which refuses a drafter with a candidate selector
rather than drafting it as plain DFlash: the end-to-end run cannot happen here. What is checked instead:
  - the export is the layout vLLM's DFlash2 reads (architecture, `dflash_config` fields, weight names, K);
  - vLLM's own DFlash2 modules, loaded with the exported weights and run on CPU (vllm_dflash2.py: the
    grouped convolutions, the target LM head's top-k and the candidate selector's scores, walked by the
    walk kernel's T = 0 rule) compute what our drafter computes: the convolutions to fp32 rounding, the
    drafts token for token;
  - the CPU build refuses to start it, naming the candidate selector (never a silently different drafter).
The rest of the drafter (DFlash's layers, context K/V, masks) is DFlash's: test_vllm_serving.py checks
vLLM's DFlash drafts against ours token for token.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import models
from conftest import ENV, HERE
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from flashmap_ext.integrations.vllm import export_dflash2, speculative_config

REFUSAL = "Model Runner V1 does not support: DFlash candidate-head drafts"  # vllm/config/vllm.py, 0.32.0


@pytest.fixture(scope="module")
def dflash2(assets):
    root = assets["root"]
    ours = models.tiny_dflash2(assets["target"], root / "dflash2_ours")
    out = export_dflash2(root / "dflash2_ours", root / "dflash2")
    return {"ours": ours, "export": out, "spec": speculative_config(out)}


def test_export_is_the_layout_vllm_reads(dflash2):
    from vllm import ModelRegistry
    raw = json.loads((dflash2["export"] / "config.json").read_text())
    c = dflash2["ours"].config
    assert raw["architectures"] == ["DFlash2DraftModel"] and "DFlash2DraftModel" in ModelRegistry.get_supported_archs()
    draft = raw["dflash_config"]
    assert (draft["conv_kernel_size"], draft["conv_group_size"], draft["selector_rank"], draft["selector_top_k"]) \
        == (c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k)
    assert (draft["mask_token_id"], draft["target_layer_ids"]) == (c.mask_token_id, list(c.target_layer_ids))
    assert dflash2["spec"] == {"method": "dflash", "model": str(dflash2["export"]), "num_speculative_tokens": 3}
    exported, state = load_file(dflash2["export"] / "model.safetensors"), dflash2["ours"].state_dict()
    assert set(exported) == set(state)
    for name, tensor in state.items():
        assert torch.equal(exported[name], tensor), name


def test_vllm_modules_compute_our_drafter(assets, dflash2, tmp_path):
    g = torch.Generator().manual_seed(7)
    d, k = dflash2["ours"].config.hidden_size, dflash2["spec"]["num_speculative_tokens"]
    inputs = {"x": torch.randn(3 * (k + 1), d, generator=g), "y": torch.randn(3 * (k + 1), d, generator=g),
              "hidden": torch.randn(4, k, d, generator=g), "anchor": torch.randint(0, models.VOCAB, (4,), generator=g)}
    save_file(inputs, tmp_path / "inputs.safetensors")
    cmd = [sys.executable, str(HERE / "vllm_dflash2.py"), str(dflash2["export"]), str(assets["root"] / "target"),
           str(tmp_path / "inputs.safetensors"), str(tmp_path / "vllm.safetensors"), str(k)]
    proc = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    theirs = load_file(tmp_path / "vllm.safetensors")

    drafter = DFlash2Drafter.from_pretrained(dflash2["export"], assets["target"]).eval()
    with torch.no_grad():
        for i, layer in enumerate(drafter.layers):
            for side in ("attention_conv", "mlp_conv"):
                conv_in, delta = getattr(layer, side).prepare(inputs["x"][None])
                conv_out = getattr(layer, side).finish(inputs["y"][None], delta)
                for name, ours in (("in", conv_in[0]), ("out", conv_out[0])):
                    assert torch.allclose(theirs[f"layers.{i}.{side}.{name}"], ours, atol=1e-5, rtol=1e-5), (i, side, name)
        unary = drafter.vocab_logits(inputs["hidden"])
        drafts = drafter.select(unary, inputs["hidden"], inputs["anchor"])
    assert not torch.equal(drafts, unary.argmax(-1)), "the selector changes no draft: the comparison proves nothing"
    assert theirs["drafts"].tolist() == drafts.tolist()


def test_cpu_build_refuses_to_serve_it(assets, dflash2):
    root = assets["root"]
    cmd = [sys.executable, str(HERE / "run_vllm.py"), str(root / "target"), str(root / "prompts.json"),
           str(root / "dflash2.json"), json.dumps(dflash2["spec"])]
    proc = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=1200)
    assert proc.returncode != 0 and REFUSAL in proc.stderr, proc.stderr[-6000:]
    assert not (root / "dflash2.json").exists()
