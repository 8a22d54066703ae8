"""The `tiny-random` target: a tiny random Qwen3 over a byte vocabulary and its tokenizer (runs anywhere,
no weights: `flashmap generate --target tiny-random`)."""
from __future__ import annotations

import codecs

import torch
from transformers import BatchEncoding, Qwen3Config, Qwen3ForCausalLM

TINY = "tiny-random"
BYTE_EOS = 256
EOS_TEXT = "<|endoftext|>"  # how decode(skip_special_tokens=False) shows EOS; encode reads it back as EOS


def tiny_random_model(dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny random Qwen3 over a 257-id byte vocabulary (4 layers, hidden 64, 2048 positions)."""
    cfg = Qwen3Config(vocab_size=BYTE_EOS + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=BYTE_EOS)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


_RAW_BYTE = 0xF700  # private-use U+F700 + b stands for a byte b that is not valid UTF-8 where it occurs


def _raw_bytes(err: UnicodeDecodeError):
    """Decode error handler: a sequence cut off at the end (still streaming) becomes U+FFFD, which
    TextStream holds back; any other invalid byte b becomes U+F700 + b, which `encode` maps back to b."""
    if err.reason == "unexpected end of data":
        return "\ufffd", err.end
    return "".join(chr(_RAW_BYTE + b) for b in err.object[err.start:err.end]), err.end


codecs.register_error("flashmap_raw_bytes", _raw_bytes)


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, EOS = 256; a plain-text chat template.

    decode → encode gives back the same ids, also for the invalid UTF-8 a random model emits (its bytes
    decode to private-use characters), so `data regenerate` → `features` trains on what the target said;
    only a multi-byte sequence cut off at the very end decodes to U+FFFD. EOS shows as "<|endoftext|>" unless
    decode skips special tokens, and encode reads that text back as EOS, as a Hugging Face tokenizer does."""
    eos_token_id = pad_token_id = BYTE_EOS
    eos_token = pad_token = EOS_TEXT
    padding_side = "right"
    vocab_size = BYTE_EOS + 1  # bytes 0-255 and EOS, as the tiny-random model's embedding rows

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        parts = text.split(EOS_TEXT)
        ids = self._encode_bytes(parts[0])
        for part in parts[1:]:
            ids += [BYTE_EOS] + self._encode_bytes(part)
        return ids

    @staticmethod
    def _encode_bytes(text: str) -> list:
        ids = []
        for ch in text:
            code = ord(ch)
            ids.extend([code - _RAW_BYTE] if _RAW_BYTE <= code < _RAW_BYTE + 256 else ch.encode("utf-8"))
        return ids

    def __call__(self, text, return_tensors: str | None = None, add_special_tokens: bool = True,
                 padding: bool | str = False) -> BatchEncoding:
        """As a Hugging Face tokenizer is called: `input_ids` and `attention_mask` of one text or of a list of
        texts; padding=True (or "longest") pads with EOS on `padding_side`, mask 0 there. Without padding,
        `return_tensors="pt"` needs texts of one length in bytes."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t) for t in texts]
        masks = [[1] * len(i) for i in ids]
        if padding not in (False, "do_not_pad"):
            if padding not in (True, "longest"):
                raise ValueError(f"padding: expected True, False or 'longest', got {padding!r}")
            width = max(map(len, ids), default=0)
            pad = [width - len(i) for i in ids]
            left = self.padding_side == "left"
            ids = [[BYTE_EOS] * n + i if left else i + [BYTE_EOS] * n for i, n in zip(ids, pad)]
            masks = [[0] * n + m if left else m + [0] * n for m, n in zip(masks, pad)]
        if return_tensors is not None and len({len(i) for i in ids}) > 1:
            raise ValueError("text: texts of different lengths cannot make one tensor without padding "
                             "(padding=True pads them)")
        if isinstance(text, str) and return_tensors is None:
            ids, masks = ids[0], masks[0]
        return BatchEncoding({"input_ids": ids, "attention_mask": masks}, tensor_type=return_tensors)

    def decode(self, ids, skip_special_tokens: bool = False) -> str | list:
        """As a Hugging Face tokenizer decodes: an id, a sequence of ids (list or 1-D tensor) gives its text,
        a batch (list of lists or 2-D tensor) a list of texts; EOS is dropped with skip_special_tokens."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # tensors and numpy arrays
        ids = [ids] if isinstance(ids, int) else list(ids)
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(row, skip_special_tokens) for row in ids]
        if any(not 0 <= i <= BYTE_EOS for i in ids):
            raise ValueError(f"ids: expected ids in 0..{BYTE_EOS}, got {min(ids)}..{max(ids)}")
        runs = [[]]  # the byte runs between EOS ids, joined back with EOS's text or nothing
        for i in ids:
            if i == BYTE_EOS:
                runs.append([])
            else:
                runs[-1].append(i)
        texts = [bytes(run).decode("utf-8", errors="flashmap_raw_bytes") for run in runs]
        return ("" if skip_special_tokens else EOS_TEXT).join(texts)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list:
        """One text per sequence of ids, as `decode` gives it."""
        return [self.decode(seq, skip_special_tokens) for seq in sequences]

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True,
                            return_tensors: str | None = None, return_dict: bool = True, **template_kwargs):
        """As transformers 5's: with tokenize=False the template's text ("role: content" lines, then
        "assistant: " with add_generation_prompt); else its ids as a BatchEncoding (return_dict) or a list,
        [1, S] tensors with return_tensors="pt". Template kwargs (e.g. enable_thinking) change nothing here."""
        turns = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        text = turns + ("assistant: " if add_generation_prompt else "")
        if not tokenize:
            return text
        encoding = self(text, return_tensors=return_tensors)
        return encoding if return_dict else encoding["input_ids"]
