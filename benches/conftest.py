"""Fixtures of the microbenchmarks (pytest-benchmark). Run: `pytest benches --benchmark-only`, or
`--benchmark-disable` to run each once as a smoke test. Helpers: benches/bench_utils.py."""
import pytest
import torch


@pytest.fixture
def cuda_sync():
    """Synchronises the GPU (a no-op without one): end GPU benchmark bodies with it."""
    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
