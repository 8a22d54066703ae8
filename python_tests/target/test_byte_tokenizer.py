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
