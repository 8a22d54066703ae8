"""One vLLM engine of the peer bench (bench.py): `python -m flashmap_ext.integrations.vllm.bench_worker
TARGET PROMPTS_JSON SPEC_JSON OUT_JSON MAX_NEW_TOKENS DTYPE` (a module of its own so that vLLM's worker
processes import nothing that runs)."""
import sys

if __name__ == "__main__":
    from flashmap_ext.integrations.vllm.bench import run_method
    run_method(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
