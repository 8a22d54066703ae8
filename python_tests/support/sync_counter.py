"""`SyncCounter`: records the tensor calls that make a GPU wait for the device (a host read of a device value),
also on a CPU, where nothing waits: a torch function mode sees every tensor method and torch function.

    with SyncCounter() as sync:
        ...                       # code under test
    sync.calls                    # e.g. ['tolist'], in call order
"""
from __future__ import annotations

import os
import traceback

import torch
from torch.overrides import TorchFunctionMode

T = torch.Tensor
#: calls that read a device tensor's value on the host (or size an output by it): each is a device sync on a GPU
HOST_READS = {T.item, T.tolist, T.__bool__, T.__int__, T.__index__, T.__float__, T.cpu, T.numpy, T.__array__,
              T.nonzero, torch.nonzero, T.equal, torch.equal, torch.allclose, T.allclose, torch.unique, T.unique,
              torch.masked_select, T.masked_select, T.__format__}


def _to_host(args, kwargs) -> bool:
    """Tensor.to(...) from a device tensor to the cpu (a copy back to the host)."""
    dest = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [kwargs.get("device")]
    return args[0].device.type != "cpu" and any(d is not None and torch.device(d).type == "cpu" for d in dest)


def _caller() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if f"{os.sep}flashmap_ext{os.sep}" in f.filename]
    return f"{frames[-1].filename.split('flashmap_ext')[-1][1:]}:{frames[-1].name}" if frames else "?"


class SyncCounter(TorchFunctionMode):
    """Records host reads (HOST_READS, a device-to-cpu `.to`, `repeat_interleave` without output_size) by name
    in `calls`, and where they came from (file:line of the nearest flashmap_ext frame) in `sites`."""

    def __init__(self):
        super().__init__()
        self.calls: list = []
        self.sites: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS or (func is T.to and _to_host(args, kwargs)) or \
                (func in (torch.repeat_interleave, T.repeat_interleave) and "output_size" not in kwargs):
            self.calls.append(func.__name__)
            self.sites.append(_caller())
        return func(*args, **kwargs)
