"""The vLLM serving tests (`make test-vllm`, own venv `.venv-vllm`): skipped as a whole without vLLM.

Shared: the tiny random models on disk (`assets`, models.py) and vLLM's results per configuration
(`run_vllm`), each computed once per session in a subprocess (run_vllm.py: vLLM spawns and holds
global state).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run `make test-vllm`")

import models  # noqa: E402

HERE = Path(__file__).parent
SPEC_METHODS = ["dflash", "flashmap", "flashmap2"]
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    from flashmap_ext.integrations.vllm import export_dflash, export_flashmap
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


def run_vllm(assets, method: str) -> dict:
    """vLLM's results for `method` ("ar" or one of SPEC_METHODS), computed once per session."""
    from flashmap_ext.integrations.vllm import speculative_config
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
