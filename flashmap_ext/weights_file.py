"""`save_weights`: safetensors' `save_file` with the permissions any other file gets here.

safetensors writes its files readable by their owner only (0600); a drafter trained by one user and served by
another (a vLLM server, a teammate) could not read it. The file gets 0666 minus the process umask instead, as
`open()` would give it."""
from __future__ import annotations

import os

from safetensors.torch import save_file


def save_weights(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Writes `tensors` to the safetensors file `path` (`metadata` in its header), mode 0666 & ~umask."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~current_umask())


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
