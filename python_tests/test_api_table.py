"""Every public entry point refuses a bad argument in one TypeError / ValueError naming it and its range,
before any model work (DESIGN.md §12). One row per (entry point, argument, bad value, message fragment);
every command's --seed range: commands/test_cli_errors.py."""
import math

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext import DFlashDrafter, Eagle3Drafter, FlashMapDrafter, TreeSpec, draft_block, generate, ops
from flashmap_ext.draft_shapes.auto import AutoDrafter
from flashmap_ext.draft_shapes.cost_model import CostTable
from flashmap_ext.draft_shapes.lookup import LookupDrafter
from flashmap_ext.target import load_target
from flashmap_ext.train.trainer import TrainConfig, train
from support.drafter_doubles import random_flashmap

V = 111


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.fixture(scope="module")
def fm(model):
    return random_flashmap(model, 4, (0, 2))


def _memory(drafter, length=3, batch=1):
    memory = drafter.new_memory(batch)
    if length:
        taps = torch.randn(batch, length, 2 * 64)
        drafter.extend_memory(memory, torch.zeros(batch, length, dtype=torch.int64), taps)
    return memory


def _draft(fm, **kw):
    args = dict(memory=_memory(fm), anchor_tokens=torch.tensor([5]), seed=0, position=3)
    args.update(kw)
    return draft_block(fm, args.pop("memory"), args.pop("anchor_tokens"), **args)


def _verify(**kw):
    args = dict(target_logits=torch.randn(1, 3, 10), draft_tokens=torch.tensor([[1, 2]]))
    args.update(kw)
    return ops.verify(args.pop("target_logits"), args.pop("draft_tokens"), **args)


def _table():
    return CostTable(verify_s={1: 0.01, 9: 0.02}, draft_s=0.001)


CASES = {
    # generate (the loop): prompt, budget, sampling, seed, stop ids, tree
    "generate stop_token_ids str": (lambda m, f: generate(m, None, [1, 2], 3, stop_token_ids="x"),
                                    TypeError, "stop_token_ids must be a token id or a sequence"),
    "generate stop_token_ids float": (lambda m, f: generate(m, None, [1, 2], 3, stop_token_ids=[1.5]),
                                      TypeError, "stop_token_ids must be integer token ids"),
    "generate stop_token_ids -3": (lambda m, f: generate(m, None, [1, 2], 3, stop_token_ids=[-3]),
                                   ValueError, r"stop_token_ids must be token ids in \[0, 111\)"),
    "generate seed -1": (lambda m, f: generate(m, None, [1, 2], 3, seed=-1), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    "generate seed 2**63": (lambda m, f: generate(m, None, [1, 2], 3, seed=2**63), ValueError, r"seed must be in \[0"),
    "generate temperature str": (lambda m, f: generate(m, None, [1, 2], 3, temperature="0.5"),
                                 TypeError, "temperature must be a number"),
    "generate top_p str": (lambda m, f: generate(m, None, [1, 2], 3, top_p="1"), TypeError, "top_p must be a number"),
    "generate max_new_tokens -1": (lambda m, f: generate(m, None, [1, 2], -1), ValueError, "max_new_tokens"),
    # TreeSpec: integers >= 1, a tree deep enough for its nodes
    "TreeSpec depth 0": (lambda m, f: TreeSpec(0, 2, 3), ValueError, "TreeSpec: depth must be >= 1"),
    "TreeSpec nodes < depth": (lambda m, f: TreeSpec(7, 2, 3), ValueError, "TreeSpec: num_nodes must be >= depth"),
    "TreeSpec topk float": (lambda m, f: TreeSpec(3, 2.5, 8), TypeError, "TreeSpec: topk must be an integer"),
    "TreeSpec bool": (lambda m, f: TreeSpec(True, 2, 8), TypeError, "TreeSpec: depth must be an integer"),
    # verify / sample
    "verify seed -1": (lambda m, f: _verify(seed=-1), ValueError, r"verify: seed must be in \[0, 2\*\*63\)"),
    "verify seed row -1": (lambda m, f: _verify(seed=torch.tensor([-1])), ValueError, r"verify: seed must be in \[0"),
    "verify position -1": (lambda m, f: _verify(position=torch.tensor([-1])), ValueError,
                           r"verify: position must be in \[0, 2\*\*63\)"),
    "verify meta logits": (lambda m, f: _verify(target_logits=torch.randn(1, 3, 10, device="meta"),
                                                draft_tokens=torch.zeros(1, 2, dtype=torch.int64, device="meta")),
                           ValueError, "target_logits is a meta tensor"),
    "verify uniforms fp32": (lambda m, f: _verify(uniforms=torch.rand(1, 3)), TypeError, "uniforms must be float64"),
    "verify uniforms 1.5": (lambda m, f: _verify(uniforms=torch.full((1, 3), 1.5, dtype=torch.float64)),
                            ValueError, r"uniforms must be in \[0, 1\)"),
    "sample seed -1": (lambda m, f: ops.sample(torch.randn(1, 10), seed=-1), ValueError, "seed must be in"),
    "sample position 2**63": (lambda m, f: ops.sample(torch.randn(1, 10), position=2**63), ValueError,
                              "position must be in"),
    # draft_block
    "draft_block position -1": (lambda m, f: _draft(f, position=-1), ValueError, r"position: \[-1\]"),
    "draft_block empty memory": (lambda m, f: _draft(f, memory=_memory(f, 0), position=0), ValueError,
                                 r"memory: empty \(length 0\)"),
    "draft_block memory None": (lambda m, f: _draft(f, memory=None), TypeError, "memory: expected the FlashMapMemory"),
    "draft_block noise int64": (lambda m, f: _draft(f, noise=torch.zeros(1, 4, 64, dtype=torch.int64)), TypeError,
                                "noise: expected a floating tensor"),
    "draft_block noise NaN": (lambda m, f: _draft(f, noise=torch.full((1, 4, 64), math.nan)), ValueError,
                              "noise: holds NaN or inf"),
    "draft_block seed -1": (lambda m, f: _draft(f, seed=-1), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    "draft_block seed 2**63": (lambda m, f: _draft(f, seed=2**63), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    "draft_block seed 2**64": (lambda m, f: _draft(f, seed=2**64), ValueError, r"seed must be in \[0, 2\*\*63\)"),
    "draft_block seed row -1": (lambda m, f: _draft(f, seed=torch.tensor([-1])), ValueError, r"seed: expected"),
    "draft_block seed float": (lambda m, f: _draft(f, seed=0.5), TypeError, "seed must be an integer"),
    "draft_block steps 3": (lambda m, f: _draft(f, steps=3), ValueError, "steps: must be 1 or 2"),
    "draft_block meta anchor": (lambda m, f: _draft(f, anchor_tokens=torch.tensor([5], device="meta")), ValueError,
                                "anchor_tokens: a meta tensor"),
    "draft_block meta position": (lambda m, f: _draft(f, position=torch.tensor([3], device="meta")), ValueError,
                                  "position: a meta tensor"),
    "draft_block position float": (lambda m, f: _draft(f, position=3.0), ValueError,
                                   "position: expected an int or a .* got float 3.0"),
    "draft_block position bool": (lambda m, f: _draft(f, position=True), ValueError, "position: expected an int"),
    "generate meta input_ids": (lambda m, f: generate(m, None, torch.tensor([1, 2], device="meta"), 3), ValueError,
                                "input_ids: .* is a meta tensor"),
    # loaders
    "load_target device": (lambda m, f: load_target("tiny-random", device="tpu"), ValueError, "--device 'tpu'"),
    "load_target dtype": (lambda m, f: load_target("tiny-random", dtype="fp8"), ValueError, "dtype must be one of"),
    "FlashMapDrafter dtype": (lambda m, f: FlashMapDrafter.from_pretrained("checkpoints/flashmap-map-qwen2.5-coder-0.5b", m,
                                                                           dtype="fp8"),
                              TypeError, "FlashMapDrafter.from_pretrained: dtype must be None"),
    "DFlashDrafter dtype": (lambda m, f: DFlashDrafter.from_pretrained("checkpoints/dflash-qwen2.5-coder-0.5b", m,
                                                                       dtype=torch.int8),
                            TypeError, "DFlashDrafter.from_pretrained: dtype must be None"),
    "Eagle3Drafter dtype": (lambda m, f: Eagle3Drafter.from_pretrained("checkpoints/eagle3-qwen2.5-coder-0.5b", m,
                                                                       dtype="fp8"),
                            TypeError, "Eagle3Drafter.from_pretrained: dtype must be None"),
    "FlashMapDrafter path": (lambda m, f: FlashMapDrafter.from_pretrained("/nonexistent/fm", m), ValueError,
                             "/nonexistent/fm: no such directory"),
    # lookup and auto drafters
    "LookupDrafter num_lookup_tokens": (lambda m, f: LookupDrafter(num_lookup_tokens=0), ValueError,
                                        "LookupDrafter: num_lookup_tokens must be >= 1"),
    "LookupDrafter max_ngram float": (lambda m, f: LookupDrafter(max_ngram=2.5), TypeError,
                                      "LookupDrafter: max_ngram must be an integer"),
    "LookupDrafter inner": (lambda m, f: LookupDrafter("fm"), TypeError, "LookupDrafter: inner must be a block drafter"),
    "AutoDrafter table": (lambda m, f: AutoDrafter(None, {"draft_s": 1}), TypeError, "AutoDrafter: table must be a CostTable"),
    "AutoDrafter prior": (lambda m, f: AutoDrafter(None, _table(), drafter_prior=1.5), ValueError,
                          r"AutoDrafter: drafter_prior must be in \[0.0, 1.0\]"),
    "AutoDrafter explore_every": (lambda m, f: AutoDrafter(None, _table(), explore_every=-1), ValueError,
                                  "AutoDrafter: explore_every must be >= 0"),
    "AutoDrafter tree_nodes": (lambda m, f: AutoDrafter(None, _table(), tree_nodes=1.5), TypeError,
                               "AutoDrafter: tree_nodes must be an integer"),
    # training entry points
    "TrainConfig seed -1": (lambda m, f: TrainConfig(out="x", steps=1, lr=1e-3, seed=-1), ValueError,
                            r"TrainConfig: seed must be in \[0, 2\*\*63\)"),
    "TrainConfig steps float": (lambda m, f: TrainConfig(out="x", steps=1.5, lr=1e-3), TypeError,
                                "TrainConfig: steps must be an integer"),
    "train cfg": (lambda m, f: train(m, lambda *a: 0, [1], list, {"steps": 1}), TypeError, "train: cfg must be a TrainConfig"),
    "train loss_fn": (lambda m, f: train(m, None, [1], list, TrainConfig(out="x", steps=1, lr=1e-3)), TypeError,
                      "train: loss_fn must be callable"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_argument_is_refused_naming_it(name, model, fm):
    call, error, fragment = CASES[name]
    with pytest.raises(error, match=fragment) as err:
        call(model, fm)
    assert "\n" not in str(err.value), "one line"

