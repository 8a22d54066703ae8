"""A drafter whose weights differ in dtype from the target (e.g. a bf16 checkpoint, `from_pretrained` keeping
its stored dtype, on an fp32 target) runs as is, lossless, with one warning line naming both dtypes
(bf16 drafts several times slower on a CPU without bf16 hardware, so a silent mismatch would cost speed)."""
import warnings

import pytest
import torch

import flashmap_ext as fm
from conftest import tiny_qwen3
from flashmap_ext.draft_shapes.lookup import LookupDrafter
from flashmap_ext.speculate import drafter_dtype
from support.drafter_doubles import greedy_continuation

PROMPT = [5, 9, 2, 7, 5, 9]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def _drafter(model, dtype):
    torch.manual_seed(1)
    return fm.FlashMapDrafter.for_target(model, "cpu-tiny", init="random", target_layer_ids=(0, 2)).eval().to(dtype)


@pytest.mark.parametrize("wrap", [False, True])
def test_a_bf16_drafter_on_an_fp32_target_warns_once_and_stays_lossless(model, wrap):
    drafter = _drafter(model, torch.bfloat16)
    drafter = LookupDrafter(drafter) if wrap else drafter
    with pytest.warns(UserWarning, match=r"drafter's weights are bfloat16, the target's float32: .*"
                                         r"dtype=target.dtype\) or call drafter.to\(torch.float32\)") as seen:
        out = fm.generate(model, drafter, PROMPT, 12)
    assert len([w for w in seen if "drafter's weights" in str(w.message)]) == 1
    assert "\n" not in str(seen[0].message)
    assert out.tokens == greedy_continuation(model, PROMPT, 12).tolist()
    with pytest.warns(UserWarning, match="bfloat16, the target's float32"):  # a batch of prompts too
        fm.generate(model, drafter if not wrap else drafter.inner, [PROMPT, PROMPT[:3]], 4)


def test_matching_dtypes_and_no_drafter_say_nothing(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fm.generate(model, _drafter(model, torch.float32), PROMPT, 4)
        fm.generate(model, None, PROMPT, 4)


def _built(model, cls):
    torch.manual_seed(1)
    if cls is fm.FlashMapDrafter:
        return _drafter(model, torch.float32)
    if cls is fm.Eagle3Drafter:
        return cls.for_target(model, num_draft_tokens=4, dtype=torch.float32)
    return cls.for_target(model, mask_token_id=110, num_hidden_layers=1, block_size=5, target_layer_ids=[0, 2],
                          dtype=torch.float32)


@pytest.mark.parametrize("cls", [fm.FlashMapDrafter, fm.DFlashDrafter, fm.Eagle3Drafter])
def test_from_pretrained_takes_the_dtype_names_the_api_takes(model, tmp_path, cls):
    _built(model, cls).save_pretrained(tmp_path)
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        assert drafter_dtype(cls.from_pretrained(tmp_path, model, dtype=name)) == dtype
    with pytest.raises(TypeError, match=rf"{cls.__name__}.from_pretrained: dtype must be None .* got 'fp8'"):
        cls.from_pretrained(tmp_path, model, dtype="fp8")
