"""Error paths a user can reach from the CLI (issue 14, finding 3): each ends with exit code 2 and one
line on stderr naming the argument, never a traceback."""
import pytest
import torch
from transformers import AutoTokenizer

from flashmap_ext import cli

TINY = ["--target", "tiny-random"]


def one_line_error(argv, capsys) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


def test_unknown_hub_name_offline(monkeypatch, capsys):
    def offline(name, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
                      f"them in the cached files.\nCheck your internet connection or see how to run ... {name}")
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    err = one_line_error(["generate", "--target", "nobody/nomodel", "--prompt", "x"], capsys)
    assert "--target nobody/nomodel" in err and "couldn't connect" in err


def test_directory_that_is_not_a_model(tmp_path, capsys):
    err = one_line_error(["generate", "--target", str(tmp_path), "--prompt", "x"], capsys)
    assert f"--target {tmp_path}" in err and "no config.json" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(capsys):
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--device", "cuda"], capsys)
    assert "--device cuda" in err and "no CUDA device" in err


def test_bogus_device(capsys):
    assert "--device 'tpu'" in one_line_error(["generate", *TINY, "--prompt", "x", "--device", "tpu"], capsys)


def test_features_on_an_empty_dataset(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    err = one_line_error(["features", *TINY, "--data", str(tmp_path / "empty.jsonl"), "--out",
                          str(tmp_path / "f"), "--no-progress", "--device", "cpu"], capsys)
    assert "no conversation" in err


def test_bench_target_not_in_the_offline_cache(monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    def offline(name, **kw):
        raise OSError(f"We couldn't connect to 'https://huggingface.co'.\nCheck your connection ({name})")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", offline)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    err = one_line_error(["bench", "--target", "nobody/nomodel", "--n", "1", "--no-peers"], capsys)
    assert "--target nobody/nomodel" in err and "couldn't connect" in err
