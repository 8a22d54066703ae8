"""What machine a measurement ran on, and the dtype to run the real target in (DESIGN.md §9)."""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys

import torch

from flashmap_ext.cpu import cpu_flags, cpu_model


def auto_dtype() -> str:
    """bf16 on a GPU or a CPU with avx512_bf16 / amx_bf16 (bf16 decoding is 2.5× faster there and a verify
    block is nearly free); fp32 elsewhere (bf16 without hardware support is slower than fp32)."""
    if torch.cuda.is_available() or cpu_flags() & {"avx512_bf16", "amx_bf16"}:
        return "bf16"
    return "fp32"


def chosen_dtype(name: str) -> str:
    """A --dtype value as run: "auto" → `auto_dtype()`, any other name ("fp32", "bf16", "fp16") as given."""
    return auto_dtype() if name == "auto" else name


def set_threads(threads: int = 0) -> int:
    """Sets torch's intra-op threads: `threads` if > 0; else 1 when the machine is already busy (load
    average ≥ cores: spinning OpenMP workers then slow a bf16 forward down up to 10×), else torch's
    default. Returns the number in use."""
    if threads <= 0 and os.getloadavg()[0] >= (os.cpu_count() or 1):
        threads = 1
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def int_at_least(text: str, minimum: int, note: str = "") -> int:
    """The body of an argparse integer type: int(text) if it is >= minimum, else ArgumentTypeError
    ("expected an integer >= minimum{note}, got ...")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}{note}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}{note}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type of the count options (--max-new-tokens, --batch-size, --limit, ...): an integer >= 1,
    checked before any model loads (exit 2 naming the option)."""
    return int_at_least(text, 1)


def threads_arg(text: str) -> int:
    """argparse type of --threads: an integer >= 0 (0 = auto, see `set_threads`); ArgumentTypeError else."""
    return int_at_least(text, 0, " (0 = auto)")


def add_threads_argument(p) -> None:
    """--threads of generate, bench, demo and data generate / regenerate, checked by argparse (exit 2, before any model loads)."""
    p.add_argument("--threads", type=threads_arg, default=0,
                   help="torch intra-op threads (0 = auto: 1 on a busy machine, where it is far faster; "
                        "else torch's default)")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def busy_note(load_start: float, load_end: float, cores: int) -> str | None:
    """One line when the 1-minute load average at the start or the end of a timed run exceeds `cores` (the
    usable cores): its timings, and so its speedups, are noisy; None on a machine that was not busy."""
    load = max(load_start, load_end)
    if load <= cores:
        return None
    return (f"Note: the timings were taken on a busy machine (load {load:.2f} on {plural(cores, 'core')}): the "
            "speedups are noisy; γ and identity to greedy are unaffected.")


def _program() -> str:
    """The command's name as a user types it: `python -m flashmap_ext.cli` runs `flashmap`."""
    name = os.path.basename(sys.argv[0])
    return "flashmap" if name in ("cli.py", "__main__.py") else name


def describe() -> dict:
    """Machine, date and command line of this run, for every figure that reports a number."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    flags = cpu_flags()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [_program()] + sys.argv[1:]),
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average": round(os.getloadavg()[0], 2),
        "bf16_hw": bool(flags & {"avx512_bf16", "amx_bf16"}), "gpu": gpu,
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": _version("transformers"),
    }


def summary_line(meta: dict) -> str:
    """One line naming machine and date, for table captions and plot footers."""
    where = meta["gpu"] or (f"{meta['cpu']}, {plural(meta['cores'], 'core')}, "
                            f"{plural(meta['torch_threads'], 'torch thread')}, load {meta.get('load_average', '?')}")
    return f"{where}; torch {meta['torch']}; {meta['date'][:10]}"


def plural(n, noun: str) -> str:
    """'1 core', '2 cores' (n as given: an int, or None when unknown: 'None cores')."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None
