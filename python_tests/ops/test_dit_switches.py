"""The switched DiT kernel paths (csrc/dit/dit_switches.h) on a GPU, each in a fresh process (the switches are
read once per process): the paths that keep every sum in its order (batched fixup, attention splits from the
length, parallel merge, per-node workspaces, programmatic dependent launch) give bitwise the default kernels'
outputs, and a fused draft step captured in a CUDA graph and replayed 1000 times (split-K linears, split
attention over the memory, the LM head's argmax: every kernel that uses counters and workspaces) drafts the
same tokens; the cluster split-K (fewer splits, so other fp32 sums) stays within one bf16 rounding of them. The
fp64 error budget of every path is checked by the op tests run under the switches (benches/device_check.sh,
step dit_switch_tests)."""
import os
import subprocess
import sys

import pytest
import torch

CHILD = r"""
import sys, torch
import flashmap_ext  # loads the extension: torch.ops.flashmap
torch.manual_seed(0)
ops, out = torch.ops.flashmap, {}
dev, bf = "cuda", torch.bfloat16
r = lambda *s, scale=1.0: (scale * torch.randn(*s, device=dev)).to(bf)
for M, N, K in ((16, 2048, 2048), (16, 2048, 8192), (16, 6144, 2048), (64, 896, 896), (3, 4096, 2048)):
    x, w, b, g, res = r(M, K), r(N, K, scale=K ** -0.5), r(N), r(1, N), r(M, N)
    out[f"linear{M}x{N}x{K}"] = ops.dit_linear(x, w, b, "gelu_tanh", g, res)
for kv in ((100, 3000), (0, 4096), (1, 64), (4096, 129)):
    q, k, v = r(2, 16, 16, 128, scale=2), r(2, 4096, 16, 128, scale=2), r(2, 4096, 16, 128)
    out[f"attention{kv}"] = ops.dit_attention(q, k, v, torch.tensor(kv, dtype=torch.int32, device=dev), 0.0)
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter
from flashmap_ext.drafters.flashmap import fused
from flashmap_ext.target.tables import TargetTables
cfg = FlashMapConfig(n_layers=2, width=1024, heads=8, block_size=16, cond_dim=256, target_layer_ids=(0,),
                     d_target=1024, vocab_size=8192)
with torch.device(dev):
    drafter = FlashMapDrafter(cfg)
    drafter.reset_parameters(zero_init=False)
    tables = TargetTables(r(cfg.vocab_size, cfg.d_target, scale=0.02), r(cfg.vocab_size, cfg.d_target, scale=0.03), None)
drafter = drafter.to(bf).eval().attach_tables(tables)
with torch.no_grad():
    memory = drafter.new_memory(1)
    memory.reserve(1100)
    memory.k.copy_(torch.randn(memory.k.shape, device=dev))
    memory.v.copy_(torch.randn(memory.v.shape, device=dev))
    memory.length = 1000
    graph = fused.FusedDraftGraph(fused.pack_weights(drafter), memory, batch_size=1, steps=1)
    z = 20 * torch.randn(1000, 1, cfg.block_size, cfg.d_target, device=dev)
    anchors = torch.randint(0, cfg.vocab_size, (1000, 1), device=dev)
    out["graph_tokens"] = torch.stack([graph(memory, anchors[i], z[i]).clone() for i in range(1000)])
torch.save({k: t.cpu() for k, t in out.items()}, sys.argv[1])
"""
ORDER_KEPT = {"FLASHMAP_DIT_BATCHED_FIXUP": "1", "FLASHMAP_DIT_LENGTH_SPLITS": "1",
              "FLASHMAP_DIT_PARALLEL_MERGE": "1", "FLASHMAP_DIT_NODE_WORKSPACES": "1"}


def outputs(tmp_path, name: str, switches: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHMAP_DIT_", "FLASHMAP_LINEAR_"))}
    path = tmp_path / f"{name}.pt"
    subprocess.run([sys.executable, "-c", CHILD, str(path)], env={**env, **switches}, check=True, timeout=300)
    return torch.load(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The default kernels' outputs, computed once for the module."""
    return outputs(tmp_path_factory.mktemp("base"), "base", {})


@pytest.mark.cuda
def test_order_keeping_switches_are_bitwise_the_default(tmp_path, base):
    switched = outputs(tmp_path, "switched", ORDER_KEPT)
    for key, want in base.items():
        assert torch.equal(switched[key], want), key


@pytest.mark.cuda
def test_programmatic_dependent_launch_is_bitwise_the_default_over_1000_graph_replays(tmp_path, base):
    pdl = outputs(tmp_path, "pdl", {"FLASHMAP_DIT_PDL": "1"})
    assert base["graph_tokens"].shape == (1000, 1, 16) and base["graph_tokens"].unique().numel() > 10
    for key, want in base.items():
        assert torch.equal(pdl[key], want), key


@pytest.mark.cuda
def test_cluster_split_k_is_within_one_bf16_rounding(tmp_path, base):
    cluster = outputs(tmp_path, "cluster", {"FLASHMAP_DIT_CLUSTER_SPLITK": "1"})
    for key, want in base.items():
        if key != "graph_tokens":  # other sums: a near-tie may draft another token
            torch.testing.assert_close(cluster[key].float(), want.float(), rtol=2 ** -7, atol=1e-3, msg=key)
