"""vLLM's own DFlash2 modules (`vllm/model_executor/models/qwen3_dflash2.py`) run on CPU with an exported
checkpoint's weights; writes their outputs for the tests to compare with ours.

    python vllm_dflash2.py EXPORT_DIR TARGET_DIR INPUTS OUT NUM_SPECULATIVE_TOKENS

INPUTS (safetensors): `x`, `y` [N, d] (a sublayer's normed input and its output, N a multiple of the query
block), `hidden` [B, K, d] (the drafter's final hidden states), `anchor` [B]. OUT (safetensors):
`layers.{i}.{attention,mlp}_conv.{in,out}` (DFlashGroupedConv.prepare on x, .finish on y) and `drafts`
[B, K]: the candidates of vLLM's `compute_candidates` (the target's LM head through LogitsProcessor's
top-k) scored by vLLM's CandidateSelector, walked by the rule of DFlash2Speculator's walk kernel at T = 0
(transcribed: the kernel is Triton, which this CPU build does not run).

vLLM's modules are built standalone (one process, gloo, no compilation) because the CPU build refuses to
start a DFlash2 drafter (Model Runner V1, see test_vllm_dflash2.py).
"""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


@contextmanager
def _vllm_context(rendezvous: Path):
    """A current vLLM config (no compilation) and a one-process model-parallel group (vLLM's linear layers
    ask for it)."""
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{rendezvous}")
        initialize_model_parallel(1, 1)
        yield


def _load(module: torch.nn.Module, weights: dict[str, torch.Tensor], prefix: str) -> None:
    """Every parameter of `module` from `weights[prefix + name]` through vLLM's weight loaders."""
    for name, param in module.named_parameters():
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            param.data.copy_(weights[prefix + name])
        else:
            loader(param, weights[prefix + name])
    for sub in module.modules():
        method = getattr(sub, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(sub)


def convolutions(config: dict, weights: dict, k: int, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """As DFlash2Qwen3DecoderLayer builds them: the block is the anchor + k query slots."""
    from vllm.model_executor.models.qwen3_dflash2 import DFlashGroupedConv
    draft = config["dflash_config"]
    out = {}
    for i in range(config["num_hidden_layers"]):
        for side in ("attention_conv", "mlp_conv"):
            prefix = f"layers.{i}.{side}."
            conv = DFlashGroupedConv(hidden_size=config["hidden_size"], taps=int(draft["conv_kernel_size"]),
                                     group_size=int(draft["conv_group_size"]), block_size=1 + k,
                                     params_dtype=torch.float32, prefix=prefix.rstrip("."))
            _load(conv, weights, prefix)
            conv_in, coefficients = conv.prepare(x)
            out[prefix + "in"], out[prefix + "out"] = conv_in, conv.finish(y, coefficients)
    return out


def drafts(config: dict, weights: dict, lm_head_weight: torch.Tensor, hidden: torch.Tensor,
           anchor: torch.Tensor) -> torch.Tensor:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_dflash2 import CandidateSelector
    draft = config["dflash_config"]
    top_k = int(draft["selector_top_k"])
    vocab, d = lm_head_weight.shape
    lm_head = ParallelLMHead(vocab, d, params_dtype=torch.float32, prefix="lm_head")
    _load(lm_head, {"lm_head.weight": lm_head_weight}, "lm_head.")
    selector = CandidateSelector(hidden_size=d, vocab_size=config["vocab_size"], rank=int(draft["selector_rank"]),
                                 top_k=top_k, params_dtype=torch.float32, prefix="candidate_selector")
    _load(selector, weights, "candidate_selector.")
    b, k = hidden.shape[:2]
    ids, unary = LogitsProcessor(vocab).get_top_k_tokens(lm_head, hidden.flatten(0, 1), top_k)
    ids, unary = ids.view(b, k, top_k), unary.view(b, k, top_k)
    scores = selector(ids, unary, hidden, anchor)  # [B, K, previous candidate, candidate]
    tokens = torch.empty(b, k, dtype=torch.int64)
    for row in range(b):  # _selector_walk_kernel at temperature 0: argmax over the previous pick's row
        previous = 0  # slot 0's rows are all the anchor's
        for step in range(k):
            previous = int(scores[row, step, previous].argmax())
            tokens[row, step] = ids[row, step, previous]
    return tokens


def main(export_dir: str, target_dir: str, inputs_file: str, out_file: str, num_speculative_tokens: str) -> None:
    config = json.loads((Path(export_dir) / "config.json").read_text())
    weights = load_file(Path(export_dir) / "model.safetensors")
    lm_head = load_file(Path(target_dir) / "model.safetensors")["lm_head.weight"]
    inputs = load_file(inputs_file)
    with _vllm_context(Path(out_file).with_suffix(".rendezvous")), torch.no_grad():
        out = convolutions(config, weights, int(num_speculative_tokens), inputs["x"], inputs["y"])
        out["drafts"] = drafts(config, weights, lm_head, inputs["hidden"], inputs["anchor"])
    save_file({name: t.contiguous() for name, t in out.items()}, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:6])
