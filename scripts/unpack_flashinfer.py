"""Unpacks the headers the side-by-side verify bench needs (benches/bench_verify_side.py) from wheels that
`make flashinfer-headers` downloads with pip: include/flashinfer/ of `flashinfer-python` into
third_party/flashinfer/include/, and the curand headers of `nvidia-curand` into third_party/curand/include/
(FlashInfer's sampling.cuh includes them; a full CUDA toolkit has them already). Both folders are git-ignored.

    python scripts/unpack_flashinfer.py WHEEL_DIR DEST_DIR
"""
import glob
import os
import sys
import zipfile


def unpack(wheel: str, prefix: str, dest: str, flat: bool = False) -> int:
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                rel = os.path.basename(name) if flat else name[len(prefix):]
                out = os.path.join(dest, rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(z.read(name))
                n += 1
    return n


def main(wheels: str, dest: str) -> int:
    fi = glob.glob(os.path.join(wheels, "flashinfer_python-*.whl"))
    cr = glob.glob(os.path.join(wheels, "nvidia_curand-*.whl"))
    if not fi or not cr:
        print(f"unpack_flashinfer: need flashinfer_python-*.whl and nvidia_curand-*.whl in {wheels}", file=sys.stderr)
        return 1
    a = unpack(fi[0], "flashinfer/data/include/", os.path.join(dest, "flashinfer", "include"))
    b = unpack(cr[0], "nvidia/cu13/include/curand", os.path.join(dest, "curand", "include"), flat=True)
    print(f"unpacked {a} FlashInfer headers and {b} curand headers into {dest}")
    return 0 if a and b else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
