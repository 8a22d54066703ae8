"""The Python API as strict as the CLI: what a tokenizer returns is taken as a prompt, with output identical
to the plain id tensor; every bad input is refused in one line naming its argument. Tiny random target, CPU."""
import json
import os
import time
from pathlib import Path

import pytest
import torch

import flashmap_ext as fm
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from support.drafter_doubles import greedy_continuation

ROOT = Path(__file__).resolve().parents[1]
N = 10  # new tokens per call


def one_line(err: pytest.ExceptionInfo, starts: str) -> str:
    message = str(err.value)
    assert "\n" not in message and message.startswith(starts), message
    return message


@pytest.fixture(scope="module")
def target():
    return fm.load_target("tiny-random", "fp32", "cpu")[0]


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level fast tokenizer over the tiny target's 257 ids (256 = end of text, also the pad) with a
    chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    return fast


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    return fm.FlashMapDrafter.for_target(target.model, n_layers=1, width=32, heads=2, block_size=4).eval()


def plain(target, drafter, ids) -> list:
    """generate on the plain [S] int64 tensor; it equals plain greedy decoding (checked, not assumed)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    out = fm.generate(target, drafter, ids, N).tokens
    assert out == greedy_continuation(target.model, ids.tolist(), N).tolist()
    return out


# ---------------------------------------------------------------------------------------------------
# a tokenizer's output is a prompt


def test_generate_takes_a_tokenizers_encoding(target, drafter, tokenizer):
    encoding = tokenizer.backend_tokenizer.encode("def fib(n):")
    assert type(encoding).__name__ == "Encoding"
    assert fm.generate(target, drafter, encoding, N).tokens == plain(target, drafter, encoding.ids)


def test_generate_takes_a_chat_templates_batch_encoding(target, drafter, tokenizer):
    messages = [{"role": "user", "content": "Write fib in Python."}]
    encoding = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    assert not isinstance(encoding, torch.Tensor) and encoding["input_ids"].shape[0] == 1
    out = fm.generate(target, drafter, encoding, N)
    assert out.tokens == plain(target, drafter, encoding["input_ids"][0])


def test_generate_takes_a_dict_and_a_tokenizer_call(target, drafter, tokenizer):
    encoding = tokenizer("x = 1 +")
    want = plain(target, drafter, encoding["input_ids"])
    assert fm.generate(target, drafter, encoding, N).tokens == want
    assert fm.generate(target, drafter, {"input_ids": encoding["input_ids"]}, N).tokens == want


@pytest.mark.parametrize("side", ["right", "left"])
def test_generate_takes_a_padded_batch_and_drops_the_padding(target, drafter, tokenizer, side):
    texts = ["ab", "def fib(n):"]
    tokenizer.padding_side = side
    try:
        batch = tokenizer(texts, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = "right"
    assert (batch["attention_mask"] == 0).any()  # the short prompt is padded
    outs = fm.generate(target, drafter, batch, N)
    assert [o.tokens for o in outs] == [plain(target, drafter, tokenizer(t)["input_ids"]) for t in texts]
    unpadded = fm.generate(target, drafter, tokenizer(texts), N)  # a list of lists of ids
    assert [o.tokens for o in unpadded] == [o.tokens for o in outs]


# ---------------------------------------------------------------------------------------------------
# everything else: one line naming the argument


@pytest.mark.parametrize("bad, kind, fix", [
    ("def fib(n):", TypeError, "tokenize it first"),
    (["def fib(n):", "x = 1"], TypeError, "tokenize them first"),
    (torch.zeros(2, 5, dtype=torch.int64), ValueError, "holds 2 prompts"),
    ({"ids": [1, 2]}, ValueError, "without 'input_ids'"),
    ({"input_ids": "def fib"}, TypeError, "hold text"),
    ([1, "a"], TypeError, "expected token ids"),
    (torch.ones(4), TypeError, "integer token ids"),
    (object(), TypeError, "expected token ids"),
    (torch.zeros(0, dtype=torch.int64), ValueError, "an empty prompt: generate needs at least one prompt token"),
])
def test_generate_refuses_what_is_no_prompt(target, bad, kind, fix):
    with pytest.raises(kind) as err:
        fm.generate(target, None, bad, N)
    assert fix in one_line(err, "input_ids")


@pytest.mark.parametrize("name, value, fix", [("timer", "yes", "a Timer"), ("on_tokens", 5, "a callable")])
def test_generate_refuses_a_hook_that_cannot_be_called(target, name, value, fix):
    with pytest.raises(TypeError) as err:
        fm.generate(target, None, [1, 2, 3], N, **{name: value})
    assert fix in one_line(err, name)


@pytest.mark.parametrize("call", ["generate", "timer", "draft_block"])
def test_switches_and_drafters_of_the_wrong_type_are_named(target, drafter, call):
    """cuda_graphs and Timer's sync take True or False (a string was accepted and read as True); draft_block
    names a drafter that is not one (it failed inside on an attribute)."""
    with pytest.raises(TypeError) as err:
        if call == "generate":
            fm.generate(target, None, [1, 2, 3], N, cuda_graphs="yes")
        elif call == "timer":
            fm.Timer(sync="x")
        else:
            fm.draft_block("x", drafter.new_memory(1, "cpu"), torch.tensor([3]), position=0)
    assert "expected" in one_line(err, {"generate": "cuda_graphs", "timer": "Timer: sync", "draft_block": "drafter"}[call])


EMPTY = "input_ids: an empty prompt: generate needs at least one prompt token (e.g. BOS)"


@pytest.mark.parametrize("prompts, budget, kind, message", [
    ([[1, 2], [3], []], 4, ValueError, f"{EMPTY}, in prompt row 2 of 3"),
    ({"input_ids": [[1, 2, 3], [4, 5, 6]], "attention_mask": [[1, 1, 1], [0, 0, 0]]}, 4, ValueError,
     f"{EMPTY}, in prompt row 1 of 2"),  # all padding
    ({"input_ids": [[1, 2, 3], [4, 5]], "attention_mask": [[1, 1, 1], [1, 1, 1]]}, 4, ValueError,
     "input_ids: 'attention_mask' of shape [3] does not match 'input_ids' of shape [2] in prompt row 1"),
    ({"input_ids": [[1, 2], [3, "a"]]}, 4, TypeError,
     "input_ids: expected token ids (an [S] integer tensor, a list of ints, a list of prompts or a tokenizer's "
     "output), got prompt row 1 of the mapping's 'input_ids' = list [3, 'a']"),
    ([{"input_ids": [1, 2]}, {"input_ids": [[3], [4]]}], 4, ValueError,
     "input_ids: a list of tokenizer outputs, whose output at row 1 holds 2 prompts: pass that output alone, or "
     "one output per prompt"),
    ([[1, 2], "hello"], 4, TypeError,
     "input_ids: text (str 'hello'), not token ids: tokenize it first and pass the tokenizer's output as is, e.g. "
     "tokenizer(text) or tokenizer.apply_chat_template(messages, add_generation_prompt=True), in prompt row 1 of 2"),
    ([[1, 2], [3]], [4, 2048], ValueError,
     "max_new_tokens: 2048 new tokens after a 1-token prompt exceed the target's context of 2048 positions (at most "
     "2047 here), in prompt row 1 of 2"),
])
def test_generate_names_the_row_of_a_bad_prompt_in_a_batch(target, prompts, budget, kind, message):
    with pytest.raises(kind) as err:
        fm.generate(target, None, prompts, budget)
    assert str(err.value) == message


def test_generate_says_an_empty_list_holds_no_prompts(target):
    with pytest.raises(ValueError) as err:
        fm.generate(target, None, [], N)
    assert "an empty list of prompts" in one_line(err, "input_ids")


def test_generate_names_the_tree_drafters_for_a_block_drafter(target, drafter):
    with pytest.raises(ValueError) as err:
        fm.generate(target, drafter, [1, 2, 3], N, tree=fm.TreeSpec(3, 2, 6))
    assert all(name in one_line(err, "tree") for name in ("Eagle3Drafter", "LookupDrafter", "TopKTreeDrafter"))


@pytest.mark.parametrize("cls", [fm.FlashMapDrafter, fm.DFlashDrafter, DFlash2Drafter, fm.Eagle3Drafter])
def test_from_pretrained_refuses_swapped_arguments(target, cls):
    with pytest.raises(TypeError) as err:
        cls.from_pretrained(target, "checkpoints/flashmap-flow-qwen2.5-coder-0.5b")
    assert "path must be a checkpoint folder" in one_line(err, f"{cls.__name__}.from_pretrained")


def test_generate_refuses_a_stop_id_outside_the_vocabulary(target):
    for bad in ([10**9], [target.vocab_size], [-5]):
        with pytest.raises(ValueError) as err:
            fm.generate(target, None, [1, 2, 3], N, stop_token_ids=bad)
        assert f"[0, {target.vocab_size})" in one_line(err, "stop_token_ids")
    assert fm.generate(target, None, [1, 2, 3], 2, stop_token_ids=[target.vocab_size - 1]).tokens  # the edge runs


def test_generate_refuses_a_valid_vocab_above_the_logit_width_before_the_target_runs(target, monkeypatch):
    monkeypatch.setattr(target, "forward", lambda *a, **k: pytest.fail("the target ran before the check"))
    for prompts in ([1, 2, 3], [[1, 2, 3], [4, 5]]):
        with pytest.raises(ValueError) as err:
            fm.generate(target, None, prompts, N, valid_vocab=target.vocab_size + 1)
        assert f"[1, {target.vocab_size}]" in one_line(err, "valid_vocab")
    monkeypatch.undo()
    assert fm.generate(target, None, [1, 2, 3], 2, valid_vocab=target.vocab_size).tokens  # the edge runs


def test_generate_names_max_new_tokens_when_only_the_budget_is_too_long(target):
    prompt = [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError) as err:
        fm.generate(target, None, prompt, 10**12)
    message = one_line(err, "max_new_tokens")
    assert "prompt too long" not in message and f"at most {target.max_positions - 6}" in message
    with pytest.raises(ValueError) as err:
        fm.generate(target, None, [1] * (target.max_positions + 1), 1)
    assert "prompt too long" in one_line(err, "input_ids")


@pytest.mark.parametrize("name, value, range_text", [("temperature", -1.0, "finite and >= 0"),
                                                     ("temperature", float("nan"), "finite and >= 0"),
                                                     ("top_k", -1, ">= 0"), ("top_p", 0.0, "in (0, 1]"),
                                                     ("top_p", 1.5, "in (0, 1]")])
def test_generate_names_the_bad_sampling_parameter_alone(target, name, value, range_text):
    with pytest.raises(ValueError) as err:
        fm.generate(target, None, [1, 2, 3], N, **{name: value})
    message = one_line(err, name)
    assert range_text in message and all(other not in message for other in {"temperature", "top_k", "top_p"} - {name})


@pytest.mark.parametrize("folder, kind", [("flashmap-flow-qwen2.5-coder-0.5b", "a FlashMap"),
                                          ("dflash-qwen2.5-coder-0.5b", "a DFlash"),
                                          ("eagle3-qwen2.5-coder-0.5b", "an EAGLE-3")])
def test_load_target_refuses_a_drafter_checkpoint_in_one_line(folder, kind):
    path = ROOT / "checkpoints" / folder
    with pytest.raises(ValueError) as err:
        fm.load_target(path)
    assert f"this is {kind} drafter checkpoint, not a target model" in one_line(err, f"spec {path}")


def test_load_target_names_a_relative_folder_without_a_model(tmp_path, monkeypatch):
    """`--target feats` (a folder given without ./) was taken for a hub name and failed in the tokenizer,
    asking to install sentencepiece."""
    (tmp_path / "feats").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        fm.load_target("feats", "fp32", "cpu")
    assert "not a model directory (no config.json)" in one_line(err, "spec feats")


def test_load_target_takes_the_offline_targets_short_name(tmp_path, monkeypatch):
    """"qwen2.5-coder-0.5b" loads the folder the asset cache holds (here: a tiny model saved in its place)."""
    from flashmap_ext.assets import models as assets
    from flashmap_ext.target import tiny_random_model
    model = tiny_random_model()
    model.save_pretrained(tmp_path / "qwen")
    monkeypatch.setattr(assets, "qwen05_dir", lambda: tmp_path / "qwen")
    from transformers import AutoTokenizer
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda name, **kw: ("tokenizer of", name))
    target, tokenizer = fm.load_target("qwen2.5-coder-0.5b", "fp32", "cpu")
    assert tokenizer == ("tokenizer of", str(tmp_path / "qwen"))
    for (name, got), want in zip(target.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(got, want), name


def test_load_target_refuses_a_model_folder_without_tokenizer_files(tmp_path):
    """transformers loads a one-entry tokenizer from such a folder, which would turn every prompt into no tokens."""
    from flashmap_ext.target import tiny_random_model
    tiny_random_model().save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError) as err:
        fm.load_target(tmp_path / "bare", "fp32", "cpu")
    assert "lacks the tokenizer files" in one_line(err, f"spec {tmp_path / 'bare'}: its tokenizer has")


def test_load_target_refuses_what_is_no_name(tmp_path):
    with pytest.raises(TypeError) as err:
        fm.load_target(torch.nn.Linear(2, 2))
    assert "model name or path" in one_line(err, "spec")


def test_load_target_errors_name_its_arguments_and_the_command_lines_name_its_options(capsys, monkeypatch):
    """From Python the message names the argument (spec, device), from the command line the option."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(ValueError) as err:
        fm.load_target("tiny-random", device="cuda")
    assert str(err.value).startswith("device cuda: no CUDA device available")
    with pytest.raises(ValueError) as err:
        fm.load_target("tiny-random", device="gpu")
    assert str(err.value) == "device 'gpu': not a device (expected cpu, cuda or cuda:N)"
    from flashmap_ext import cli
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    assert cli.main(["generate", "--target", "tiny-random", "--device", "cuda", "--prompt", "hi"]) == 2
    assert "error: --device cuda: no CUDA device available" in capsys.readouterr().err


def test_load_target_refuses_an_uncached_hub_name_at_once_without_network(monkeypatch):
    """Without network the hub client retries a missing name for most of a minute; the loader asks the
    resolver once and refuses in one line. A cached name goes on to the loader (here: a stub that fails)."""
    import socket

    from flashmap_ext.target import load as load_mod

    def no_network(host, port, *args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        fm.load_target("no-such-org/no-such-model", "fp32", "cpu")
    assert time.perf_counter() - start < 10
    assert "not in the Hugging Face cache" in one_line(err, "spec no-such-org/no-such-model")
    from transformers import AutoTokenizer

    def stub(name, **kw):
        raise OSError("stub loader")
    monkeypatch.setattr(load_mod, "in_hub_cache", lambda name: True)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", stub)
    with pytest.raises(ValueError) as err:
        fm.load_target("no-such-org/no-such-model", "fp32", "cpu")
    assert "cannot load it (stub loader)" in one_line(err, "spec no-such-org/no-such-model")


def test_auto_dtype_is_public_and_loadable():
    assert fm.auto_dtype() in ("bf16", "fp32") and "auto_dtype" in fm.__all__
    target, _ = fm.load_target("tiny-random", fm.auto_dtype(), "cpu")
    assert target.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[fm.auto_dtype()]


def test_drafter_kind_is_named_with_its_article():
    from flashmap_ext.drafters.common.checkpoint import CheckpointError
    from flashmap_ext.drafters.load import check_drafter
    path = str(ROOT / "checkpoints" / "eagle3-qwen2.5-coder-0.5b")
    if not (Path(path) / "model.safetensors").is_file():
        pytest.skip("committed weights not materialised (make checkpoints)")
    with pytest.raises(CheckpointError) as err:
        check_drafter(path, "dflash", kind_flag=None)
    assert f"--drafter {path} is an EAGLE-3 checkpoint (its config.json says so); --drafter takes a DFlash" \
        in one_line(err, "--drafter")


# ---------------------------------------------------------------------------------------------------
# draft_block's seed, bench's Ctrl-C line, the demo's margin caption


def test_draft_block_defaults_to_generates_seed(target, drafter):
    """Without `seed`, draft_block drafts what generate(seed=0) drafts: the same block, every call."""
    ids = torch.tensor([[5, 17, 3, 99, 42]])
    out = target.forward(ids, target.new_cache(), num_logits=1, tap_layer_ids=drafter.target_layer_ids)
    memory = drafter.new_memory(1, "cpu")
    drafter.extend_memory(memory, ids[:, :-1], out.taps[:, :-1])
    anchor, position = ids[:, -1], ids.shape[1] - 1
    block = fm.draft_block(drafter, memory, anchor, position=position)
    assert torch.equal(block.tokens, fm.draft_block(drafter, memory, anchor, position=position, seed=0).tokens)
    noise = drafter.sample_noise(torch.tensor([0]), torch.tensor([position]))  # the seed-0 stream, drawn apart
    assert torch.equal(block.tokens, fm.draft_block(drafter, memory, anchor, noise=noise).tokens)
    with pytest.raises(ValueError) as err:
        fm.draft_block(drafter, memory, anchor, position=position, seed=None)
    one_line(err, "seed")


@pytest.mark.parametrize("finished", [False, True])
def test_bench_interrupted_says_what_it_kept(tmp_path, monkeypatch, capsys, finished):
    from flashmap_ext import cli
    from flashmap_ext.commands import bench
    out = tmp_path / "bench"

    def interrupted(args):
        if finished:  # a prompt finished: results.json is written
            out.mkdir()
            (out / "results.json").write_text(json.dumps({"partial": {}}))
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "run", interrupted)
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    assert cli.main(["bench", "--target", "tiny-random", "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    if finished:
        assert err.endswith("the prompts that finished are in --out (results.json, marked partial)"), err
    else:
        assert err.endswith("no prompt had finished, so nothing was written") and not out.exists(), err


def test_bench_interrupted_ignores_an_older_results_file(tmp_path, monkeypatch, capsys):
    from flashmap_ext import cli
    from flashmap_ext.commands import bench
    (tmp_path / "results.json").write_text("{}")
    os.utime(tmp_path / "results.json", (time.time() - 3600,) * 2)  # from an earlier run
    monkeypatch.setattr(bench, "run", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    assert cli.main(["bench", "--target", "tiny-random", "--out", str(tmp_path)]) == 130
    assert "nothing was written" in capsys.readouterr().err


def test_demo_explains_a_negative_margin():
    from flashmap_ext.bench.metrics import Record
    from flashmap_ext.commands.demo import divergence_notes
    row = Record("FlashMap", "gsm8k", "p1", [1, 2], 1.0, [4], [1], 0.1, 0.1, 0.1)
    row.divergence = {"position": 7, "kind": "token", "ar_token": 1, "token": 2, "margin": -0.016}
    notes = "\n".join(divergence_notes([row], "bf16"))
    assert "target logit margin -0.016" in notes
    assert "negative: that forward ranks FlashMap's token first" in notes


def _drafter_for(kind, model):
    torch.manual_seed(1)
    if kind == "dflash":
        return fm.DFlashDrafter.for_target(model, mask_token_id=1, num_hidden_layers=1, block_size=4,
                                           target_layer_ids=[0, 1], dtype=torch.float32).eval()
    if kind == "eagle3":
        return fm.Eagle3Drafter.for_target(model, num_draft_tokens=3, dtype=torch.float32).eval()
    return fm.FlashMapDrafter.for_target(model, "cpu-tiny", init="random", target_layer_ids=(0, 1)).eval()


def test_flashmap_only_arguments_name_the_drafter_with_its_article():
    from conftest import tiny_qwen3
    model = tiny_qwen3()
    drafter = _drafter_for("eagle3", model)
    memory = drafter.new_memory(1)
    with pytest.raises(ValueError, match=r"^steps: only a FlashMapDrafter takes it, not an Eagle3Drafter$"):
        fm.draft_block(drafter, memory, torch.tensor([1]), position=0, steps=2)


@pytest.mark.parametrize("kind", ["flashmap", "dflash", "eagle3", "wrapped"])
@pytest.mark.parametrize("other, field", [(dict(vocab_size=8), "vocab_size 8 != the target's vocabulary"),
                                          (dict(hidden_size=32), "!= the target's hidden size 64")])
def test_generate_refuses_a_drafter_built_for_another_target_as_from_pretrained_does(kind, other, field):
    """A drafter of a vocab-8 target drafted on a vocab-4 one without complaint (from_pretrained refuses it)."""
    from conftest import tiny_qwen3
    from flashmap_ext.draft_shapes.lookup import LookupDrafter
    from flashmap_ext.drafters.common.base import TargetMismatch
    built_for = tiny_qwen3(**{"vocab_size": 4, "num_layers": 2, **other})
    drafter = _drafter_for("flashmap" if kind == "wrapped" else kind, built_for)
    drafter = LookupDrafter(drafter) if kind == "wrapped" else drafter
    with pytest.raises(TargetMismatch) as err:
        fm.generate(tiny_qwen3(vocab_size=4, num_layers=2), drafter, [1, 2, 3], 4)
    assert field in one_line(err, "drafter: ") and "built for another target" in str(err.value)


def test_a_tokenizer_output_over_a_list_of_one_text_is_a_batch_of_one(target):
    """`tokenizer(texts)` gives a list of B rows; with B = 1 that was one GenerateOutput instead of a list of one."""
    one = fm.generate(target, None, {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]}, 3)
    assert isinstance(one, list) and len(one) == 1
    assert one[0].tokens == fm.generate(target, None, [1, 2, 3], 3).tokens
    assert not isinstance(fm.generate(target, None, {"input_ids": torch.tensor([[1, 2, 3]])}, 3), list)  # [1, S]
    listed = fm.generate(target, None, [{"input_ids": [[1, 2]]}, {"input_ids": [4, 5]}], 2)  # tokenizer([t]) each
    assert [o.tokens for o in listed] == [fm.generate(target, None, p, 2).tokens for p in ([1, 2], [4, 5])]
