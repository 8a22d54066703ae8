"""The vLLM serving tests (`make test-vllm`, own venv `.venv-vllm`): skipped as a whole without vLLM."""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run `make test-vllm`")
