"""train/data.py and train/regenerate.py: training tokens are exactly the inference stream."""
import json

import pytest
import torch

from flashmap_ext.train.data import load_samples, prompt_ids, read_jsonl, render_conversation
from flashmap_ext.train.regenerate import done_ids, regenerate
from support.train_fixtures import qwen3_style_tokenizer

CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def tok():
    return qwen3_style_tokenizer("bpe")


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def inference_prompt(tok, messages, thinking):
    return tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking,
                                   return_dict=True)["input_ids"]


@pytest.mark.parametrize("thinking", [False, True])
def test_single_turn_is_inference_prompt_plus_response(tok, thinking):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world, how are you?"},
            {"role": "assistant", "content": "the cat sat on the mat", "reasoning_content": "two plus two"}]
    (s,) = render_conversation(tok, msgs, enable_thinking=thinking)
    # What the target emits after the prompt, written out by hand for each mode.
    response = ("<think>\ntwo plus two\n</think>\n\n" if thinking else "") + "the cat sat on the mat<|im_end|>"
    prompt = inference_prompt(tok, msgs[:2], thinking)
    assert tok.decode(prompt).endswith("assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
    assert s.input_ids == prompt + encode(tok, response)
    assert s.loss_mask == [0] * len(prompt) + [1] * len(encode(tok, response))


@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3_multi_turn_splits_where_history_is_rewritten(tok, thinking):
    msgs = [{"role": "user", "content": "hello"},
            {"role": "assistant", "content": "the cat", "reasoning_content": "hmm"},
            {"role": "user", "content": "how are you?"}, {"role": "assistant", "content": "the dog"}]
    samples = render_conversation(tok, msgs, enable_thinking=thinking, id="c")
    # Turn 1 was generated after an empty think block (off) or with its reasoning (on); history renders it
    # without either, so turn 3's prompt does not extend turn 1's sequence: two sequences.
    assert [s.id for s in samples] == ["c/0", "c/1"]
    responses = [("<think>\nhmm\n</think>\n\n" if thinking else "") + "the cat<|im_end|>",
                 ("<think>\n\n</think>\n\n" if thinking else "") + "the dog<|im_end|>"]
    for s, i, text in zip(samples, (1, 3), responses):
        prompt = inference_prompt(tok, msgs[:i], thinking)
        assert s.input_ids == prompt + encode(tok, text)
        assert s.loss_mask == [0] * len(prompt) + [1] * len(encode(tok, text))


def test_chatml_multi_turn_shares_one_sequence_with_both_responses_supervised():
    tok = qwen3_style_tokenizer("bpe")
    tok.chat_template = CHATML
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the cat"},
            {"role": "user", "content": "how are you?"}, {"role": "assistant", "content": "the dog"}]
    (s,) = render_conversation(tok, msgs)
    full = encode(tok, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nthe cat<|im_end|>\n"
                       "<|im_start|>user\nhow are you?<|im_end|>\n<|im_start|>assistant\nthe dog<|im_end|>")
    assert s.input_ids == full
    supervised = [t for t, m in zip(s.input_ids, s.loss_mask) if m]
    assert tok.decode(supervised) == "the cat<|im_end|>the dog<|im_end|>"


def test_thinking_off_drops_inline_think_block(tok):
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nthe cat"}]
    (s,) = render_conversation(tok, msgs, enable_thinking=False)
    assert tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if m]) == "the cat<|im_end|>"


def test_load_samples_record_flag_truncation_and_errors(tok, tmp_path):
    path = tmp_path / "conv.jsonl"
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the cat sat"}]
    path.write_text(json.dumps({"messages": msgs, "enable_thinking": True}) + "\n"
                    + json.dumps({"id": "x", "messages": msgs}) + "\n" + '{"messages": [')  # torn last line
    n = len(inference_prompt(tok, msgs[:1], False)) + 2
    a, b = load_samples(str(path), tok, enable_thinking=False, max_length=n)
    assert (a.id, b.id) == ("0/0", "x/0")
    assert len(a.input_ids) == n and len(b.input_ids) == n and sum(b.loss_mask) == 2
    # record 0 asked for thinking on: its prompt has no empty think block, so more response fits
    on = inference_prompt(tok, msgs[:1], True)
    assert a.input_ids[:len(on)] == on and sum(a.loss_mask) == n - len(on)
    with pytest.raises(ValueError, match="assistant"):
        render_conversation(tok, [{"role": "user", "content": "hi"}], id="bad")
    path.write_text('{"messages": [\n' + json.dumps({"messages": msgs}) + "\n")
    with pytest.raises(ValueError, match="conv.jsonl:1"):
        list(read_jsonl(str(path)))


class CountingLM(torch.nn.Module):
    """Stand-in causal LM whose greedy continuation is always `reply` then eos; counts generate calls."""

    def __init__(self, reply, eos):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.reply, self.eos, self.calls = reply, eos, []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        self.calls.append((input_ids.shape[0], kw["do_sample"]))
        tail = torch.tensor((self.reply + [self.eos] + [0] * max_new_tokens)[:max_new_tokens])
        return torch.cat([input_ids, tail.expand(input_ids.shape[0], -1)], 1)


def test_regenerate_batched_resumable(tok, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hello"},
                                         {"role": "assistant", "content": "old"}]} for i in range(5)]
    rows[1]["domain"] = "math"  # kept in the answer: `train --domain-weight` reads it
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = CountingLM(encode(tok, "the cat"), tok.eos_token_id)
    assert regenerate(model, tok, str(src), str(out), batch_size=2, limit=3, progress=False) == 3
    with open(out, "a") as f:
        f.write('{"id": "torn')  # an interrupted write
    assert done_ids(str(out)) == {"r0", "r1", "r2"}
    assert regenerate(model, tok, str(src), str(out), batch_size=2, progress=False) == 2
    assert model.calls == [(2, False), (1, False), (2, False)]
    recs = list(read_jsonl(str(out)))
    assert [r["id"] for r in recs] == [f"r{i}" for i in range(5)]
    assert recs[0]["messages"][-1] == {"role": "assistant", "content": "the cat"}
    assert recs[0]["finish"] == "stop" and recs[0]["enable_thinking"] is False
    assert recs[1]["domain"] == "math" and "domain" not in recs[0]
    assert regenerate(model, tok, str(src), str(out), progress=False) == 0
    model.reply = encode(tok, "the cat sat on the mat")
    out2 = tmp_path / "out2.jsonl"
    regenerate(model, tok, str(src), str(out2), max_new_tokens=3, limit=1, progress=False)
    assert next(read_jsonl(str(out2)))["finish"] == "length"


def test_regenerate_counts_records_without_a_user_turn(tok, tmp_path, capsys):
    """They are still skipped, but no longer silently: one stderr line at the end gives their number."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    user = [{"role": "user", "content": "hello"}]
    rows = [{"id": "a", "messages": user}, {"id": "b", "messages": [{"role": "system", "content": "x"}]},
            {"id": "c", "messages": []}, {"id": "d"}, {"id": "e", "messages": user}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = CountingLM(encode(tok, "ok"), tok.eos_token_id)
    assert regenerate(model, tok, str(src), str(out), batch_size=4, progress=False) == 2
    err = capsys.readouterr().err
    assert err.count("regenerate: skipped 3 record(s) with no user turn") == 1
    assert [r["id"] for r in read_jsonl(str(out))] == ["a", "e"]
    assert regenerate(model, tok, str(src), str(out), progress=False) == 0   # done ones are not counted
    assert "skipped 3 record(s)" in capsys.readouterr().err


def test_regenerate_ends_answers_at_the_context(tok, tmp_path):
    """--max-new-tokens 100000000 ran on past the target's context (transformers only warned)."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hello"}]}) + "\n")
    model = CountingLM(encode(tok, "the cat sat on the mat"), tok.eos_token_id)
    prompt = len(prompt_ids(tok, [{"role": "user", "content": "hello"}], False))
    model.config = type("Config", (), {"max_position_embeddings": prompt + 2})()
    seen = []
    generate = model.generate
    model.generate = lambda *a, max_new_tokens, **kw: seen.append(max_new_tokens) or generate(
        *a, max_new_tokens=max_new_tokens, **kw)
    regenerate(model, tok, str(src), str(out), max_new_tokens=100_000_000, progress=False)
    assert seen == [2] and next(read_jsonl(str(out)))["finish"] == "length"


def test_regenerate_refuses_messages_that_are_not_a_list_of_turns(tok, tmp_path):
    """`"messages": "hi"` died in an AttributeError ('str' object has no attribute 'get')."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "q", "messages": "hi"}) + "\n")
    model = CountingLM(encode(tok, "ok"), tok.eos_token_id)
    with pytest.raises(ValueError, match=r"--data: record 'q': 'messages' must be a list of \{role, content\}"):
        regenerate(model, tok, str(src), str(tmp_path / "out.jsonl"), progress=False)
