"""The tiny-random target's byte tokenizer called as a Hugging Face tokenizer is (the README's quickstart
line `tokenizer(text, return_tensors="pt").input_ids`); expected ids: Python's own UTF-8 bytes."""
import pytest
import torch

from flashmap_ext.target.tiny import ByteTokenizer


def test_called_on_one_text_gives_its_utf8_bytes():
    tok = ByteTokenizer()
    text = "héllo"
    want = list(text.encode("utf-8"))
    assert tok(text)["input_ids"] == want and tok(text).attention_mask == [1] * len(want)
    ids = tok(text, return_tensors="pt").input_ids
    assert ids.dtype == torch.int64 and ids.tolist() == [want]
    assert tok.decode(ids[0].tolist()) == text


def test_called_on_a_list_and_refusing_ragged_tensors():
    tok = ByteTokenizer()
    assert tok(["ab", "c"]).input_ids == [[97, 98], [99]]
    assert tok(["ab", "cd"], return_tensors="pt").input_ids.tolist() == [[97, 98], [99, 100]]
    with pytest.raises(ValueError, match="^text: "):
        tok(["ab", "c"], return_tensors="pt")


def test_chat_template_tokenizes_by_default_as_transformers_does():
    tok = ByteTokenizer()
    chat = [{"role": "user", "content": "hi"}]
    text = "user: hi\nassistant: "
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == text
    assert tok.apply_chat_template(chat, tokenize=False) == "user: hi\n"  # no generation prompt by default
    want = list(text.encode("utf-8"))
    assert tok.apply_chat_template(chat, add_generation_prompt=True).input_ids == want
    assert tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False) == want
    pt = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", enable_thinking=False)
    assert pt.input_ids.tolist() == [want]
    assert len(tok) == tok.vocab_size == 257


def test_generate_takes_the_chat_template_output_and_matches_greedy():
    from flashmap_ext import FlashMapDrafter, generate, load_target
    target, tok = load_target("tiny-random")
    drafter = FlashMapDrafter.for_target(target, "cpu-tiny")
    chat = [{"role": "user", "content": "hi"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    res = generate(target, drafter, ids, max_new_tokens=6, temperature=0.0)
    seq = ids.input_ids.clone()  # plain greedy decoding of the HF model, the reference
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, target.model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert list(res.tokens) == seq[0, ids.input_ids.shape[1]:].tolist()


def test_decode_takes_tensors_and_batches_and_shows_eos_unless_skipped():
    """As transformers 5's decode: a 2-D tensor or list of lists gives one text per row, EOS is shown by default
    and dropped with skip_special_tokens; the expected texts are Python's own UTF-8 decoding."""
    tok = ByteTokenizer()
    rows = torch.tensor([list(b"ab") + [256], list(b"cd") + [256]])
    assert tok.decode(rows) == ["ab<|endoftext|>", "cd<|endoftext|>"]
    assert tok.decode(rows.tolist(), skip_special_tokens=True) == ["ab", "cd"]
    assert tok.decode(rows[0]) == "ab<|endoftext|>" and tok.decode(104) == "h"
    assert tok.encode("ab<|endoftext|>cd") == [97, 98, 256, 99, 100]  # read back as EOS, not 13 bytes
    cut = list("€".encode("utf-8"))[:2] + [256] + list("é".encode("utf-8"))
    assert tok.decode(cut) == "\ufffd<|endoftext|>é"
    with pytest.raises(ValueError, match="^ids: "):
        tok.decode([1, 300])


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_pads_with_eos_on_the_padding_side_and_masks_it(side):
    tok = ByteTokenizer()
    tok.padding_side = side
    enc = tok(["ab", "cde"], padding=True, return_tensors="pt")
    pad, short = [256], [97, 98]
    assert enc.input_ids.tolist() == [short + pad if side == "right" else pad + short, [99, 100, 101]]
    assert enc.attention_mask.tolist() == [[1, 1, 0] if side == "right" else [0, 1, 1], [1, 1, 1]]
    assert tok.pad_token_id == tok.eos_token_id == 256 and tok.encode(tok.eos_token) == [256]
    with pytest.raises(ValueError, match="^padding: "):
        tok(["a"], padding="max_length")


def test_decode_takes_numpy_arrays_and_batch_decode_gives_one_text_per_row():
    import numpy as np
    tok = ByteTokenizer()
    rows = np.array([[72, 105], [111, 256]])
    assert tok.decode(rows) == ["Hi", "o<|endoftext|>"] == tok.batch_decode(rows)
    assert tok.batch_decode(rows, skip_special_tokens=True) == ["Hi", "o"]
    assert tok.decode(np.int64(72)) == "H"
