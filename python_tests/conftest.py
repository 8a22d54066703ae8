"""Shared fixtures: deterministic seeding, devices, tiny random HF targets (no downloads)."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# Tiny models are launch-bound: one intra-op thread is faster and immune to a busy machine. The CI's
# second pass (`make test-numerics`) sets FLASHMAP_TEST_THREADS=2: another reduction split in the BLAS.
torch.set_num_threads(int(os.environ.get("FLASHMAP_TEST_THREADS", "1")))
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny_qwen3(vocab_size=111, hidden_size=64, num_layers=4, seed=0, dtype=torch.float32, max_pos=512):
    """A tiny random Qwen3ForCausalLM (no hub access). Weights depend only on `seed`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden_size // 4, max_position_embeddings=max_pos, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # sharper distributions than the default init, so greedy decoding is non-trivial
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture
def tiny_target():
    return tiny_qwen3()
